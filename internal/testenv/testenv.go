// Package testenv names the real services that idem's tests use (see
// "Tests and real services" in docs/design.md) and skips a test, saying
// which variable enables it, when that service is not configured. .ci/run
// sets every variable and fails on a skip that names one, so CI skips
// nothing.
package testenv

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// The variables that name the services, and the service each names.
const (
	Postgres = "IDEM_TEST_POSTGRES"    // PostgreSQL URL
	Redis    = "IDEM_TEST_REDIS"       // Redis URL
	NATS     = "IDEM_TEST_NATS"        // NATS (JetStream) URL
	AMQP     = "IDEM_TEST_AMQP"        // RabbitMQ URL
	DynamoDB = "IDEM_TEST_DYNAMODB"    // DynamoDB-compatible endpoint (dynalite)
	SQS      = "IDEM_TEST_SQS"         // SQS-compatible endpoint (local-aws-sqs)
	SMTP     = "IDEM_TEST_SMTP"        // SMTP host:port (Mailpit)
	Mailpit  = "IDEM_TEST_MAILPIT_API" // Mailpit's HTTP API
	Zsh      = "IDEM_TEST_ZSH"         // a zsh binary (idem completion zsh)
	Spin     = "IDEM_TEST_SPIN"        // a spin binary (the protocol model, internal/model)
	Chromium = "IDEM_TEST_CHROMIUM"    // a Chromium binary (the console's browser test)
	// PostgresBin is a directory holding initdb and pg_ctl: a test starts
	// a private PostgreSQL server there, one it may restart (idem chaos's
	// store-restart fault). Unset, the test looks in
	// /usr/lib/postgresql/*/bin.
	PostgresBin = "IDEM_TEST_POSTGRES_BIN"
)

// Example returns a value for name that works on the project's machines.
func Example(name string) string {
	switch name {
	case Postgres:
		return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	case Redis:
		return "redis://127.0.0.1:6379/0"
	case NATS:
		return "nats://127.0.0.1:4222"
	case AMQP:
		return "amqp://guest:guest@127.0.0.1:5672/"
	case DynamoDB:
		return "http://127.0.0.1:4567"
	case SQS:
		return "http://127.0.0.1:9324"
	case SMTP:
		return "127.0.0.1:1025"
	case Mailpit:
		return "http://127.0.0.1:8025"
	case Zsh:
		return "/usr/bin/zsh"
	case Spin:
		return "/usr/bin/spin"
	case Chromium:
		return "/usr/bin/chromium"
	case PostgresBin:
		return "/usr/lib/postgresql/16/bin"
	}
	return "..."
}

// Require returns the value of the variable name, or skips t with a message
// naming the variable, an example value and suite (what it enables).
func Require(t testing.TB, name, suite string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Skip(SkipMessage(name, suite))
	}
	return v
}

// SkipMessage is the message Require skips with.
func SkipMessage(name, suite string) string {
	return "set " + name + "=" + Example(name) + " to run " + suite
}

// ShortParallel is the -parallel of a -short run of a package that calls
// RunShortParallel.
const ShortParallel = 8

// RunShortParallel runs m (call it from TestMain: os.Exit(RunShortParallel(m)))
// with -parallel ShortParallel when the run is -short and does not set
// -parallel, and as asked otherwise. It is for packages whose parallel
// tests mostly wait (for leases, visibility timeouts and retries), which
// the default -parallel, GOMAXPROCS, runs two at a time on 2 cores. The
// full run, as CI's, keeps go test's default.
func RunShortParallel(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		set := false
		flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
		if !set {
			if err := flag.Set("test.parallel", strconv.Itoa(ShortParallel)); err != nil {
				panic(err)
			}
		}
	}
	return m.Run()
}
