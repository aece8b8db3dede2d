/*
 * A model of idem's claim / lease / fence / attempt protocol, for spin.
 * docs/guarantees.md ("The model") says what it covers and what it leaves
 * out; model_test.go runs it. One key, W workers (the Ledger's Do, in
 * processes that deliver the key until it is terminal), the store's record
 * (store/transition.go: claimable, held, finish, extend, resolvable,
 * resolve), the lease as a "lapsed" flag that the clock sets, an operator
 * (idem resolve), and the faults: SIGKILL at any step, a lease that lapses
 * under a live worker (a stall: GC pause, SIGSTOP, partition), a store
 * answer lost before or after the store applied the write.
 *
 * Run (model_test.go runs the configurations docs/guarantees.md lists):
 *   spin -a -DPOL=1 idem.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan -m20000
 * and, after a violation, replay its trail: spin -t -p -g idem.pml
 *
 * Every invariant is a hidden variable named for it (hidden: not part of
 * the state), set and asserted in one step, so that spin's "assertion
 * violated" names the invariant.
 *
 * Macros (-D):
 *   POL       1 AtLeastOnce, 2 AtMostOnce, 3 AtMostOnce with a Reconcile
 *             hook (claims take lapsed attempts over, the hook asks the
 *             provider before fn runs)
 *   W         workers (2 or 3); K acquired claims per worker (attempt ids)
 *   CRASHES   SIGKILLs in a run; STALLS leases lapsed under a live holder;
 *             LOSSES store answers lost; ERRS fn errors. The defaults are
 *             model_test.go's bounds.
 *   Mutants, each a bug the checker must find (model_test.go):
 *   MUT_FINISH_NO_FENCE    Finish checks only that the record is in progress
 *   MUT_AMO_TAKEOVER       a claim takes over a lapsed AtMostOnce attempt
 *   MUT_NO_READBACK        a claim whose answer was lost is not read back
 *   MUT_RESOLVE_NO_FENCE   Resolve drops its fence condition
 *   MUT_RESOLVE_SAME_FENCE Resolve does not add one to the fence
 *   MUT_CLAIM_RUNNING      a claim takes an in-progress record whose lease runs
 *   MUT_NO_FINISH_RETRY    a completion whose answer was lost is not sent again
 *   MUT_UNDO_RELEASES_TAKEOVER  a lost takeover is undone by a release, not
 *                          an abandon (the Reconcile hook is not asked again)
 *   MUT_NOTDONE_ABANDONS   fn's idem.NotDone abandons the key, not releases it
 *   MUT_RELEASED_NOT_CLAIMABLE  a released key answers duplicate
 */

#ifndef POL
#define POL 1
#endif
#ifndef W
#define W 2
#endif
#ifndef K
#define K 2
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef STALLS
#define STALLS 1
#endif
#ifndef LOSSES
#define LOSSES 1
#endif
#ifndef ERRS
#define ERRS 1
#endif

#define ALO 1
#define AMO 2
#define REC 3
#define NA (W*K+1) /* attempt ids 1..W*K; 0 is none */

/* Record status. */
#define ABSENT   0
#define INPROG   1
#define DONE     2
#define RELEASED 3

/* Outcomes, as the journal entry of an attempt records them. */
#define O_NONE      0
#define O_COMPLETED 1
#define O_RELEASED  2
#define O_ABANDONED 3
#define O_RESOLVED  4

/* The store's record of the one key. */
byte status = ABSENT;
byte fence = 0;   /* 0 while absent; the first claim makes it 1 */
byte aid = 0;     /* the attempt id holding it; 0 after an abandon */
bit lapsed = 0;   /* the lease has passed (derived from time in the code) */
bit tk = 0;       /* the holder's journal entry is a takeover */
byte rpol = 0;    /* the record's policy, written at claim time */
bit lr = 0;       /* the last attempt that ran fn ended released with an
                   * error (ledger.go's releasedWithError): a Reconcile
                   * hook asks before the next one runs */
byte jout[NA];    /* the journal: each attempt's outcome */

/* The world outside the store. */
byte effects = 0;     /* effects done downstream */
byte faulted = 0;     /* effects whose attempt was SIGKILLed, lost its lease (a stall) or
                       * ended in fn's error of unknown outcome, before completing */
byte crashes = 0, stalls = 0, losses = 0, errs = 0;
byte unknowns = 0;    /* fn errors after the effect (effect.ErrOutcomeUnknown): abandoned */
byte finished = 0;    /* workers whose deliveries ended */
byte dead = 0;        /* workers killed */
byte gaveup = 0;      /* workers that ran out of attempt ids (the bound, not a result) */
bit opreleased = 0;   /* the operator resolved not done */
byte run_aid[W];      /* the attempt each live worker is running fn for, 0 if none */
bit did[W];           /* ... and whether that attempt did its effect */
bit fault[W];         /* ... and whether its lease lapsed under it */
bit counted[W];       /* ... and whether its effect is counted in faulted */

/* Ghosts: which worker and which generation (claim or resolution) the
 * store's current fence belongs to, kept apart from fence and attempt id. */
byte gh = 255;
byte gen = 0;

/* The invariants. */
hidden byte fence_monotonic, single_holder, stale_finish_refused,
	atmostonce_no_second_effect, atleastonce_dup_only_after_fault,
	lost_claim_undone, resolve_respects_fence, completed_has_effect,
	atleastonce_no_loss, atmostonce_stuck_only_after_fault,
	reconcile_exactly_once;

/* the attempt (a, f) holds the key: store.held */
#ifdef MUT_FINISH_NO_FENCE
#define HELD(a, f) (status == INPROG)
#else
#define HELD(a, f) (status == INPROG && aid == (a) && fence == (f))
#endif

/* some live worker is running the holder's fn */
#if W == 2
#define RUNNING (aid != 0 && (run_aid[0] == aid || run_aid[1] == aid))
#else
#define RUNNING (aid != 0 && (run_aid[0] == aid || run_aid[1] == aid || run_aid[2] == aid))
#endif

/* Count worker w's effect as cut by a fault, once. */
inline cut(w) {
	if
	:: did[w] && !counted[w] -> counted[w] = 1; faulted++
	:: else
	fi
}

inline newfence(f) {
	fence_monotonic = (f > fence); assert(fence_monotonic);
	fence = f
}

/* A killed worker stops for good: SIGKILL at any step. */
#define CRASHPOINT \
	if \
	:: crashes < CRASHES -> \
		atomic { crashes++; dead++; cut(me); run_aid[me] = 0; goto out } \
	:: true \
	fi

/* store.Store.Claim (store.claimable and store.claim). ans: 1 acquired,
 * 2 duplicate, 3 busy, 4 indeterminate. */
#define A_ACQ 1
#define A_DUP 2
#define A_BUSY 3
#define A_INDET 4
inline claim(me, my, ans, takeover, prevrel) {
	takeover = 0; prevrel = 0;
	if
	:: status == ABSENT -> ans = A_ACQ
#ifdef MUT_RELEASED_NOT_CLAIMABLE
	:: status == RELEASED -> ans = A_DUP
#else
	:: status == RELEASED -> ans = A_ACQ; prevrel = 1
#endif
	:: status == DONE -> ans = A_DUP
	:: status == INPROG ->
		if
#ifdef MUT_CLAIM_RUNNING
		:: true -> ans = A_ACQ; takeover = 1
#else
		:: !lapsed -> ans = A_BUSY
#ifdef MUT_AMO_TAKEOVER
		:: lapsed -> ans = A_ACQ; takeover = 1
#else
		:: lapsed && (rpol == ALO || POL == REC) -> ans = A_ACQ; takeover = 1
		:: lapsed && rpol != ALO && POL != REC -> ans = A_INDET
#endif
#endif
		fi
	fi;
	if
	:: ans == A_ACQ ->
		single_holder = !(status == INPROG && !lapsed); assert(single_holder);
		newfence(fence + 1);
		if
		:: takeover && aid != 0 && jout[aid] == O_NONE -> lr = 0 /* its entry is marked lapsed */
		:: else
		fi;
		status = INPROG; aid = my; lapsed = 0; tk = takeover;
		rpol = (POL == ALO -> ALO : AMO);
		gh = me; gen++
	:: else
	fi
}

/* store.Store.Finish of the attempt (my, myf) with outcome o: ok 1 when
 * applied, 0 for ErrLeaseLost. nr: the attempt never ran fn (an undone
 * claim: store.NotRunReason). */
inline finish(me, my, myf, mygen, o, nr, ok) {
	if
	:: HELD(my, myf) ->
		ok = 1;
		stale_finish_refused = (gh == me && gen == mygen); assert(stale_finish_refused);
		jout[my] = o;
		if
		:: o == O_COMPLETED -> status = DONE; lr = 0
		:: o == O_RELEASED -> status = RELEASED;
			if
			:: !nr -> lr = 1
			:: else
			fi
		:: o == O_ABANDONED -> aid = 0; lapsed = 1; /* stays in progress, lapsed from now */
			if
			:: !nr -> lr = 0
			:: else
			fi
		fi;
		gh = 255
	:: else -> ok = 0
	fi
}

/* Ledger.write: a finishing write sent until it gets an answer; a retry
 * refused after a try whose answer was lost reads the journal back. ok 1
 * when the write was recorded, 0 for ErrLeaseLost. */
inline write(me, my, myf, mygen, o, nr, ok) {
	uncertain = 0;
	do
	:: atomic {
		if
		:: losses < LOSSES -> losses++; lostw = 1 /* never reached the store */
		:: true ->
			finish(me, my, myf, mygen, o, nr, ok);
			if
			:: losses < LOSSES -> losses++; lostw = 1 /* applied, answer lost */
			:: true -> lostw = 0
			fi
		fi
	   }
	   if
#ifdef MUT_NO_FINISH_RETRY
	   :: lostw -> ok = 0; break /* given up: the key is left to its lease */
#else
	   :: lostw -> uncertain = 1; CRASHPOINT
#endif
	   :: !lostw && (ok || !uncertain) -> break
	   :: !lostw && !ok && uncertain ->
		ok = (jout[my] == o); /* an earlier try landed */
		break
	   fi
	od
}

/* Extend (the heartbeat): renews the lease if the attempt holds the key,
 * even a lapsed one nobody took over. */
inline extend(my, myf, ok) {
	if
	:: HELD(my, myf) -> lapsed = 0; ok = 1
	:: else -> ok = 0
	fi
}

/* The effect, downstream. */
inline effect(me) {
	atomic {
		effects++; did[me] = 1;
		if
		:: fault[me] -> cut(me)
		:: else
		fi;
		/* With a Reconcile hook, a stall lets the stalled attempt do its
		 * effect after the hook found none: at least once, then. */
		atmostonce_no_second_effect = (POL == ALO || (POL == REC && stalls > 0) || effects <= 1);
		assert(atmostonce_no_second_effect);
		atleastonce_dup_only_after_fault = (effects <= 1 + faulted);
		assert(atleastonce_dup_only_after_fault)
	}
}

proctype worker(byte me) {
	byte n = 0, my, myf, mygen, ans;
	bit takeover, prevrel, ok, lostw, uncertain, found;
next:
	/* Forget what the last delivery left (a smaller state space). */
	atomic {
		ans = 0; takeover = 0; prevrel = 0; ok = 0; lostw = 0; uncertain = 0; found = 0;
		myf = 0; mygen = 0; did[me] = 0; fault[me] = 0; counted[me] = 0
	}
	CRASHPOINT;
	if
	:: n >= K -> atomic { gaveup++; goto out }
	:: else
	fi;
	my = me * K + n + 1;
	/* Claim: the answer may be lost, whether the store applied it or not. */
	atomic {
		ans = 0; lostw = 0;
		if
		:: losses < LOSSES -> losses++; lostw = 1
		:: true ->
			claim(me, my, ans, takeover, prevrel);
			if
			:: losses < LOSSES -> losses++; lostw = 1
			:: true
			fi
		fi;
		if
		:: lostw -> n++
		:: !lostw && ans == A_ACQ -> n++; myf = fence; mygen = gen; run_aid[me] = my;
			did[me] = 0; fault[me] = 0; counted[me] = 0
		:: else
		fi
	}
	if
	:: lostw ->
		/* store.UndoLostClaim: read the key; if this attempt holds it,
		 * fn has not run: release a fresh claim, abandon a takeover. */
#ifndef MUT_NO_READBACK
		CRASHPOINT;
		atomic {
			found = (status == INPROG && aid == my);
			if
			:: found -> myf = fence; mygen = gen; takeover = tk
			:: else
			fi
		}
		if
		:: found ->
			CRASHPOINT;
			atomic {
#ifdef MUT_UNDO_RELEASES_TAKEOVER
				finish(me, my, myf, mygen, O_RELEASED, 1, ok)
#else
				finish(me, my, myf, mygen, (takeover -> O_ABANDONED : O_RELEASED), 1, ok)
#endif
			}
		:: else
		fi;
#endif
		atomic { lost_claim_undone = !(status == INPROG && aid == my); assert(lost_claim_undone) }
		goto next /* a store error: the queue delivers the key again */
	:: !lostw && ans == A_DUP -> goto out
	:: !lostw && ans == A_INDET -> goto out
	:: !lostw && ans == A_BUSY -> goto next
	:: !lostw && ans == A_ACQ
	fi;

	/* Acquired. With a Reconcile hook, a takeover (or a key released with
	 * an error) asks the provider first: done records the effect found,
	 * by Resolve with this attempt's id as its condition. */
	if
	:: POL == REC && (takeover || (prevrel && lr)) ->
		CRASHPOINT;
		if
		:: effects > 0 ->
			atomic {
				if
				:: HELD(my, myf) ->
					stale_finish_refused = (gh == me && gen == mygen); assert(stale_finish_refused);
					newfence(fence + 1); status = DONE; jout[my] = O_RESOLVED; gh = 255; gen++
				:: else
				fi;
				run_aid[me] = 0
			}
			goto next /* done, or refused: delivered again, and answered then */
		:: else
		fi
	:: else
	fi;

	atomic { ans = 0; takeover = 0; prevrel = 0; lostw = 0 }
	/* fn, with heartbeats. A refused heartbeat cancels fn's context: fn
	 * stops before its effect. */
	CRASHPOINT;
	if
	:: atomic { extend(my, myf, ok); if :: !ok -> run_aid[me] = 0 :: else fi }
	   if
	   :: !ok -> goto next
	   :: else
	   fi
	:: true
	fi;
	CRASHPOINT;
	if
	:: true ->
		effect(me);
		CRASHPOINT;
		if
		:: atomic { extend(my, myf, ok) } /* a refusal now comes too late to stop it */
		:: true
		fi;
		CRASHPOINT;
		write(me, my, myf, mygen, O_COMPLETED, 0, ok);
		/* Refused: the lease lapsed under it (a stall, counted then). */
		run_aid[me] = 0;
		if
		:: ok -> goto out
		:: else -> goto next
		fi
	:: errs < ERRS -> /* idem.NotDone: nothing happened, released */
		errs++;
#ifdef MUT_NOTDONE_ABANDONS
		write(me, my, myf, mygen, O_ABANDONED, 0, ok);
#else
		write(me, my, myf, mygen, O_RELEASED, 0, ok);
#endif
		run_aid[me] = 0;
		goto next
	:: POL != ALO && errs < ERRS -> /* an error after the effect: abandoned (AtMostOnce) */
		errs++; unknowns++;
		effect(me);
		CRASHPOINT;
		write(me, my, myf, mygen, O_ABANDONED, 0, ok);
		atomic { run_aid[me] = 0; cut(me) }
		goto next
	fi;
out:
	finished++
}

/* Time: a lease passes. Free when nobody runs the holder's fn (it was
 * killed, or abandoned the key); a stall when its worker lives. */
proctype clock() {
	byte w;
end:
	do
	:: atomic { status == INPROG && !lapsed && !RUNNING -> lapsed = 1 }
	:: atomic { status == INPROG && !lapsed && RUNNING && stalls < STALLS ->
		lapsed = 1; stalls++;
		for (w : 0 .. W-1) {
			if
			:: run_aid[w] == aid -> fault[w] = 1; cut(w)
			:: else
			fi
		}
	   }
	od
}

/* An operator (idem resolve --done / --not-done, with the fence and lapsed
 * conditions it inspected): done when the effect happened; not done when
 * it did not and cannot (nobody runs the holder's fn); else leaves it. */
proctype operator() {
	byte f, g;
	bit done;
end:
	atomic {
		status == INPROG && lapsed ->
		f = fence; g = gen;
		if
		:: effects > 0 -> done = 1
		:: effects == 0 && !RUNNING && POL != ALO -> done = 0
		:: else -> goto end2
		fi
	}
	atomic {
#ifdef MUT_RESOLVE_NO_FENCE
		if
		:: status == INPROG && lapsed ->
#else
		if
		:: status == INPROG && lapsed && fence == f ->
#endif
			resolve_respects_fence = (gen == g); assert(resolve_respects_fence);
#ifdef MUT_RESOLVE_SAME_FENCE
			newfence(fence);
#else
			newfence(fence + 1);
#endif
			if
			:: aid != 0 && jout[aid] == O_NONE -> jout[aid] = O_RESOLVED; lr = 0
			:: else
			fi;
			gen++; gh = 255;
			if
			:: done -> status = DONE
			:: else -> status = RELEASED; opreleased = 1
			fi
		:: else
		fi
	}
end2:
	skip
}

init {
	byte i;
	atomic {
		for (i : 0 .. W-1) { run worker(i) }
		run clock();
		run operator()
	}
	finished == W;
	atomic {
		completed_has_effect = (status != DONE || effects >= 1);
		assert(completed_has_effect);
		/* Every key completed, unless every worker was killed (or the
		 * bound on attempts ran out, or an operator released it by hand). */
		atleastonce_no_loss = (POL != ALO || dead == W || gaveup > 0 || status == DONE);
		assert(atleastonce_no_loss);
		/* A key left in progress (listed by idem ls --stuck) was left by a
		 * fault (a kill, a stall, or fn's error of unknown outcome), never
		 * by a live worker whose store failed. */
		atmostonce_stuck_only_after_fault = (POL != AMO || status != INPROG || crashes + stalls + unknowns > 0);
		assert(atmostonce_stuck_only_after_fault);
		reconcile_exactly_once = (POL != REC || dead == W || gaveup > 0 || opreleased ||
			(status == DONE && (effects == 1 || stalls > 0)));
		assert(reconcile_exactly_once)
	}
}
