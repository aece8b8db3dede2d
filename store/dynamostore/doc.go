// Package dynamostore keeps idem's ledger in one DynamoDB table
// (aws-sdk-go-v2): one item per key, every write a conditional PutItem,
// UpdateItem or DeleteItem on that item, every read strongly consistent.
// Use it on AWS when the program has no database of its own, for example
// in a Lambda function (queue/lambdasqs).
//
//	client := dynamodb.NewFromConfig(cfg)
//	if err := dynamostore.CreateTable(ctx, client, "idem"); err != nil { // once, at deployment
//		return err
//	}
//	ledger := idem.New(dynamostore.New(client, "idem"))
//
// The package's examples show this in full, and a table on an emulator.
// [CreateTable] makes the table (partition key [AttrKey], a string;
// on-demand capacity; TTL on [AttrTTL]) and waits until it is active;
// [CheckTable] checks one made by infrastructure code. Several stores must
// not share a table: [Store.List] and [Store.Sweep] read every item in it.
// [Store.Close] leaves the client (the caller's) as it is.
//
// # Guarantees
//
// Every write is conditioned on what it changes, so the store is
// linearizable per key on one table in one region: of two claims of a
// free key exactly one succeeds, and an attempt's Finish or Extend
// applies only while its fence and attempt id still hold the key
// (otherwise [store.ErrLeaseLost]). Global tables replicate
// asynchronously, last writer wins, so two regions can each grant the
// same key: use one region's table for idem.
//
// The client retries a request whose answer it did not get; every write
// stores a call id, so a call that finds its own write answers as if the
// first attempt had been answered. A call whose retries run out, or whose
// context ends, returns an error: a store error, never an outcome, and the
// key is left to its lease and policy.
//
// DynamoDB has no clock to read in a condition: leases and retention run
// on the clock of the process that makes the call (time.Now, or
// [WithClock]). A worker whose clock runs ahead by more than what is left
// of a lease takes the key over while its holder is still running (under
// AtLeastOnce the effect may happen twice; under AtMostOnce the key is
// reported indeterminate early); the fence still refuses the overtaken
// holder's writes. Keep the clocks synchronized (NTP; Amazon Time Sync on
// AWS keeps them within about a millisecond) and leases long compared to
// the skew.
//
// An item expires when its ExpiresAt passes, checked on every call:
// DynamoDB's TTL deletes expired items only within a day or two, and
// emulators not at all, so TTL is for cleaning up, not for correctness;
// [Store.Sweep] deletes expired items without waiting for it.
//
// Items are at most 400 KB ([MaxItemSize]). A result over [MaxResultSize]
// (350 KB) is refused before anything is sent, with an error wrapping
// [ErrItemTooLarge], and the key is left to its lease (the Ledger reports
// a store error); reasons are cut to [MaxReasonLen] bytes. Keep results
// small: store a reference (an id, an S3 key) rather than a large body.
//
// # Options and defaults
//
//   - [WithReadFirst]: a claim reads the item before writing (default
//     false: it writes first, the cheaper choice when most claims are of
//     new keys; reading first suits redelivering queues and retrying
//     senders, where most claims find a record).
//   - [WithKeepExpired]: how long an item stays past its expiry, so that a
//     later claim continues the key's fences; default 24 hours
//     ([DefaultKeepExpired]).
//   - [WithClock]: default time.Now.
//
// A Ledger.Do of a new key costs 2 write units (claim and completion) for
// a record of up to 1 KB, plus 1 per heartbeat of a long fn. List and Sweep
// are Scans: their cost grows with the table, so they are for operators.
//
// docs/stores.md in the repository explains the item layout, each call's
// requests and conditions, fences, TTL, retries, items from before attempt
// ids, and the cost of every call in capacity units:
// https://github.com/idemkit/idem/blob/main/docs/stores.md#dynamostore-dynamodb
package dynamostore
