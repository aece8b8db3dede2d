package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/idemkit/idem/store/sqlitestore"
)

// screenshotsVar names the variable that makes TestConsoleBrowser write
// its screenshots into docs/console/ (IDEM_CONSOLE_SCREENSHOTS=1).
const screenshotsVar = "IDEM_CONSOLE_SCREENSHOTS"

// TestConsoleBrowser drives the console in headless Chromium (Debian's
// chromium, IDEM_TEST_CHROMIUM): it loads each page of a ledger with stuck,
// failed and completed keys and a queue with dead letters, resolves the
// indeterminate key through its confirmation, redrives a dead letter, and
// checks the pages and the store afterwards. With
// IDEM_CONSOLE_SCREENSHOTS=1 it saves a screenshot of each page to
// docs/console/.
func TestConsoleBrowser(t *testing.T) {
	chromium := testenv.Require(t, testenv.Chromium, "the console's browser test")
	ctx := context.Background()
	clk := newClock()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlitestore.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	seedConsole(t, st, clk.Advance)
	qs, err := sqlqueue.NewSQLite(ctx, st.DB())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qs.Close() })
	orders, _ := qs.Queue("orders")
	mail, _ := qs.Queue("mail")
	fillQueues(t, orders, mail)
	c, logs := newConsoleTest(t, st, "", "", false)

	actx, cancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	shots := os.Getenv(screenshotsVar) != ""
	shot := func(name string) {
		t.Helper()
		if !shots {
			return
		}
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "console", name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v\nserver log:\n%s", what, err, logs)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	expect := func(sel string, want ...string) {
		t.Helper()
		got := text(sel)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Fatalf("%s reads %q, want %q in it", sel, got, w)
			}
		}
	}

	// The overview: counts, the keys to decide, takeovers, queues.
	do("overview", chromedp.Navigate(c.base+"/console/"), chromedp.WaitVisible(chromedp.CSS("#counts")))
	expect("#decide", "mail:stuck", "mail:lapsed", "mail:failed")
	expect("#events", "takeover", "lease lost", "pay:1")
	expect("#queues", "orders")
	shot("overview")

	// The records, filtered to the stuck keys.
	do("records", chromedp.Navigate(c.base+"/console/records"), chromedp.WaitVisible(chromedp.CSS("#records")))
	expect("#records", "mail:done", "mail:failed", "mail:running", "pay:1")
	shot("records")
	do("filter", chromedp.SetValue(chromedp.CSS(`select[name="state"]`), "stuck"),
		chromedp.Click(chromedp.CSS(`.filters button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#records")))
	if got := text("#records"); !strings.Contains(got, "mail:stuck") || strings.Contains(got, "mail:done") {
		t.Fatalf("the stuck filter lists:\n%s", got)
	}

	// The indeterminate key: its story, then resolve it as done.
	do("key page", chromedp.Click(chromedp.CSS(`#records a[href*="mail%3astuck"], #records a[href*="mail%3Astuck"]`)),
		chromedp.WaitVisible(chromedp.CSS("#verdict")))
	expect("#state", "indeterminate")
	expect("#verdict", "lapsed without recording its outcome")
	expect("#timeline", "claimed by worker-1")
	shot("key")
	do("confirmation", chromedp.Click(chromedp.CSS("#do-done")), chromedp.WaitVisible(chromedp.CSS("#consequence")))
	expect("#consequence", "does not run the operation")
	do("reason", chromedp.SendKeys(chromedp.CSS(`input[name="reason"]`), "provider log: sent at 03:12"))
	shot("confirm")
	do("resolve", chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#msg")))
	expect("#msg", "Resolved as done")
	expect("#state", "completed")
	if rec := mustGet(t, st, "mail:stuck"); rec.Status != idem.StatusCompleted || rec.Reason != "provider log: sent at 03:12" {
		t.Fatalf("the store after the resolve: %+v", rec)
	}

	// The queues: redrive the oldest dead letter.
	do("queues", chromedp.Navigate(c.base+"/console/queues"), chromedp.WaitVisible(chromedp.CSS("#queues")))
	expect("table.dead", "poison")
	shot("queues")
	do("redrive confirmation", chromedp.Click(chromedp.CSS(`a[href*="do=one"]`)), chromedp.WaitVisible(chromedp.CSS("#consequence")))
	expect("#consequence", "receive count reset to 0")
	do("redrive", chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#msg")))
	expect("#msg", "1 dead letter(s) of orders redriven")
	if s, err := orders.Stats(ctx); err != nil || s.DeadLettered != 1 {
		t.Fatalf("the queue after the redrive: %+v %v", s, err)
	}
}
