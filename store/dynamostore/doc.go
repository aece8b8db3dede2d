// Package dynamostore is an store.Store kept in one DynamoDB table
// (aws-sdk-go-v2): one item per key; every write a conditional PutItem,
// UpdateItem or DeleteItem on one item, those that end or extend an
// attempt with its fence and attempt id in the condition; expiry checked
// in code on every call; the client's clock.
//
//	client := dynamodb.NewFromConfig(cfg)
//	if err := dynamostore.CreateTable(ctx, client, "idem"); err != nil { ... }
//	l := idem.New(dynamostore.New(client, "idem"))
//
// # Table
//
// The table has one string partition key, [AttrKey] ("key"), which holds
// the idem key as given, byte for byte, and no sort key. [CreateTable]
// makes it (on-demand capacity), waits until it is ACTIVE and enables TTL
// on [AttrTTL] ("ttl"); [CheckTable] checks an existing one. Several
// stores must not share a table: [Store.List] and [Store.Sweep] read every
// item in it.
//
// An item's attributes are named after the [store.Record] fields (status,
// policy, fence, attempt, attempt_id, owner, fingerprint, result, reason,
// lease_until, expires_at, created_at, updated_at), times as numbers of
// unix nanoseconds, attempt_id, reason and result absent when empty;
// "journal" is a map from each attempt's fence to its [store.JournalEntry]
// (a map under the entry's JSON names, the store.Wire* constants), and
// "call" is the id of the call that wrote the item last (see Retries).
//
// Items written before attempt ids have no attempt_id, and their journal
// entries none either: they read as AttemptID "", which no attempt's write
// names (a claim needs an attempt id), so no new attempt can finish or
// extend them. Such an item is finished already, or its attempt lapses and
// is taken over or resolved as usual. No migration is needed: the table's
// key is unchanged.
//
// # Calls
//
// Claim of a key without an item is one PutItem conditioned on
// attribute_not_exists. When the condition fails, the store decides from
// the item DynamoDB returns with the failure
// (ReturnValuesOnConditionCheckFailure ALL_OLD) or, from an endpoint that
// does not return it (dynalite), from a consistent GetItem: a duplicate,
// a busy key or a failed one is answered from that item. A key that may
// be taken (released, expired, a lapsed lease) is then written with a
// PutItem conditioned on the item being exactly the one found (by its call
// id); if another write came first, the claim decides again on what that
// write left. With [WithReadFirst] a claim reads first (a consistent
// GetItem) and writes only a key it may take: one read for a duplicate or
// a busy key, a read and a write for a new one (see its doc for when that
// is the cheaper choice).
//
// Finish and Extend are each one UpdateItem conditioned on the attempt
// holding the key: the record in_progress under the caller's fence and
// attempt id, unexpired, with its journal entry (and, for Extend, on the
// lease staying within ExpiresAt). Finish(abandoned) removes attempt_id in
// the same update, so an attempt ends once. Unlike Powertools, whose
// completion and deletion are unconditional, a stale holder is refused
// ([store.ErrLeaseLost]); the item found then is decided by the store
// package's rules ([store.ApplyFinish], [store.ApplyExtend]), and the
// stale attempt's open journal entry is marked with LateFinish by a
// conditioned PutItem (not for a Finish whose reason says the attempt
// never ran, [store.IsNotRun]). An extension past ExpiresAt takes the same
// path.
//
// Get is a consistent GetItem. Resolve reads the item (consistent),
// checks the request's conditions on it ([store.ApplyResolve]) and writes
// the decision with a PutItem conditioned on the item being the one read. Delete is one DeleteItem conditioned on the record existing
// unexpired.
//
// List and Sweep are Scans, for operators: DynamoDB keeps no order across
// partition keys, so List reads the whole table (consistent reads,
// filtered in DynamoDB) and sorts the records by key, whatever the query's
// Limit; Sweep reads the table from its start for expired items and
// deletes each with a DeleteItem conditioned on the item being the one the
// scan saw. Their cost grows with the table.
//
// DynamoDB transactions are not used (dynalite lacks them, and no call
// needs more than one item), nor is TTL needed for correctness.
//
// # Consistency
//
// Every read is strongly consistent (ConsistentRead), and every write is
// conditioned on what it changes, so the store is linearizable per key on
// one table in one region. Global tables replicate asynchronously with
// last-writer-wins between regions: two regions can each grant the same
// key; use one region's table for idem.
//
// # Clock and skew
//
// DynamoDB has no clock to read in a condition: every time (now, a lease's
// end, an expiry) comes from the clock of the process that makes the call
// (time.Now, or [WithClock]), and conditions compare those. Workers whose
// clocks disagree therefore disagree on leases by as much. A worker whose
// clock runs ahead by more than what is left of a lease takes the key over
// while its holder is still running (under AtLeastOnce the effect may
// happen twice; under AtMostOnce the key is reported indeterminate early);
// one whose clock lags waits longer than the lease. The fence still
// refuses the overtaken holder's writes: its completion gets
// [store.ErrLeaseLost]. Retention is skewed the same way. Keep the clocks
// synchronized (NTP; Amazon Time Sync on AWS keeps them within about a
// millisecond) and leases long compared to the skew.
//
// # Fences
//
// A new item's first fence is the claiming client's clock in microseconds
// since 1970 ([store.FirstFence], with no floor: the store keeps no record
// of deleted items), and every later claim or resolution of the item adds
// one. While the item exists (past its ExpiresAt too, until TTL or Sweep
// deletes it, see [WithKeepExpired]) its fences therefore never repeat.
// Once it is deleted ([Store.Delete], [Store.Sweep], TTL), the key's next
// item starts from the clock again, which is above every fence the old
// item had as long as the new claimer's clock is not behind the clock of
// the old item's last claim by more than the time between that claim and
// the deletion. A client whose clock is further behind (a large skew, a
// clock stepped back) can give the new item a fence at or below the
// deleted one's. The store still refuses a holder of the deleted item
// (its attempt id is in every condition with the fence), but a fence
// used outside the store as a fencing token may then repeat.
//
// # Expiry and TTL
//
// A record counts as absent from its ExpiresAt on, checked in code on
// every call: DynamoDB's TTL deletes expired items only within a day or
// two, and emulators not at all. The TTL attribute [AttrTTL] is ExpiresAt
// plus [WithKeepExpired] (default 24 hours), in unix seconds: until the
// item is deleted, a claim after the expiry continues the key's fence and
// attempt numbers, so that a holder from before the expiry is still
// refused. [Store.Sweep] deletes expired items without waiting for TTL.
//
// # Retries
//
// The client retries a request whose answer it did not get (its default
// retryer: 3 attempts). For a write, DynamoDB may have made it: the retry
// then fails its condition on the item the first attempt wrote. Every
// write stores a call id, unique per call, so a call that finds its own
// call id knows its write was made and answers as if the first attempt had
// been answered. A call whose retries run out, or whose context ends,
// returns an error: a store error, never an outcome, and the key is left
// to its lease and policy. (A Delete whose answer was lost reports
// [store.ErrNotFound] on the retry.)
//
// # Size limit
//
// DynamoDB refuses items over 400 KB ([MaxItemSize]), names and values
// counted. A result over [MaxResultSize] (350 KB) is refused by Finish
// and Resolve before anything is sent, with an error wrapping
// [ErrItemTooLarge]; so is any record the store can measure before writing
// it, and DynamoDB's own refusal is reported with the same error. The key
// is then left to its lease (the Ledger reports a store error). Reasons
// (error texts) are cut to [MaxReasonLen] bytes. Keep results small: store
// a reference (an id, an S3 key) rather than a large body.
//
// # Cost
//
// In capacity units, for a record of up to 1 KB (a write costs one WCU per
// KB of the larger of the old and new item, a consistent read one RCU per
// 4 KB):
//
//   - Claim of a new key: 1 WCU.
//   - Claim that finds a record (a duplicate, a busy key): 1 WCU for the
//     failed condition, plus 1 RCU for the GetItem where the endpoint does
//     not return the item (DynamoDB does).
//   - Claim that takes a key over: the above plus 1 WCU.
//   - With [WithReadFirst]: a duplicate or a busy key 1 RCU; a new key
//     1 RCU + 1 WCU; a takeover 1 RCU + 1 WCU.
//   - Finish, Extend: 1 WCU each (with a result, its size in KB).
//   - Get: 1 RCU. Delete: 1 WCU. Resolve: 1 RCU + 1 WCU.
//   - List: the whole table's size in RCU per call (Scan). Sweep: the
//     table's size in RCU plus 1 WCU per item deleted.
//
// A Ledger.Do of a new key is therefore 2 WCU (claim and completion),
// plus 1 WCU per heartbeat for a long fn.
//
// # Defaults
//
// Consistent reads always; the client's retries; the clock time.Now;
// records kept 24 hours past their retention ([DefaultKeepExpired]);
// results up to 350 KB; reasons up to 2 KB. [Store.Close] marks the store
// closed and leaves the client (the caller's) as it is.
package dynamostore
