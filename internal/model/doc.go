// Package model holds a model of idem's claim / lease / fence / attempt
// protocol in Promela (idem.pml), and the test that checks it with the
// spin model checker: every state that workers, crashes, stalls, lost
// store answers and an operator can reach together is explored, and each
// invariant the model names must hold in all of them. The same test
// checks mutants of the model (the protocol with one rule removed) and
// requires spin to find the invariant each one breaks, so that a passing
// check means something. docs/guarantees.md ("The model") says what is
// modelled, what is not, and which conformance test checks each invariant
// against the real stores.
//
// The test needs spin and a C compiler; it skips, naming IDEM_TEST_SPIN,
// when that variable does not name a spin binary.
package model
