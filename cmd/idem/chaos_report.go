package main

import (
	"fmt"
	"html/template"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// writeChaosTables prints the run's two tables: per policy, and per fault
// kind (what was injected, and the duplicates and indeterminate keys it
// caused).
func writeChaosTables(w io.Writer, rep *chaosReport) error {
	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "POLICY\tKEYS\tMESSAGES\t0 EFFECTS\t1 EFFECT\t2+ EFFECTS\tDUPLICATES\tINDETERMINATE\tSTUCK\tLOST\tDEAD LETTERS\tMSG/S\tDRAIN\tGUARANTEE")
	for _, p := range rep.Policies {
		verdict := "kept"
		if !p.OK {
			verdict = fmt.Sprintf("BROKEN (%d)", p.ViolationCount)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%s\t%s\n", p.Policy, p.Keys, p.Messages,
			p.KeysWith0, p.KeysWith1, p.KeysWith2, p.Duplicates, p.Indeterminate, p.ListedStuck, p.Lost, p.DeadLetters,
			p.Throughput, p.DrainAfterFault, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = newTable(w)
	fmt.Fprintln(tw, "POLICY\tFAULT\tINJECTED\tDUPLICATES CAUSED\tINDETERMINATE CAUSED")
	for _, p := range rep.Policies {
		for _, f := range chaosFaultKinds(p) {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", p.Policy, f, p.FaultsInjected[f], p.DuplicateCauses[f], p.IndeterminateWhy[f])
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeChaosFaultFigures(w, rep)
}

// chaosFaultKinds lists the fault kinds p saw or was attributed to, in
// the usual order, then any other cause.
func chaosFaultKinds(p *chaosPolicyReport) []string {
	seen := map[string]bool{}
	for _, m := range []map[string]int{p.FaultsInjected, p.DuplicateCauses, p.IndeterminateWhy} {
		for k := range m {
			seen[k] = true
		}
	}
	var out []string
	for _, f := range allChaosFaults {
		if seen[f] {
			out = append(out, f)
			delete(seen, f)
		}
	}
	return append(out, slices.Sorted(maps.Keys(seen))...)
}

// writeChaosReport writes chart.png and index.html into dir.
func writeChaosReport(dir string, rep *chaosReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "chart.png"))
	if err != nil {
		return err
	}
	if err := png.Encode(f, chaosChart(rep)); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	hf, err := os.Create(filepath.Join(dir, "index.html"))
	if err != nil {
		return err
	}
	type row struct {
		*chaosPolicyReport
		Kinds []string
	}
	var (
		rows               []row
		outboxes, restarts []*chaosPolicyReport
	)
	for _, p := range rep.Policies {
		rows = append(rows, row{p, chaosFaultKinds(p)})
		if p.Outbox != nil {
			outboxes = append(outboxes, p)
		}
		if p.Restart != nil {
			restarts = append(restarts, p)
		}
	}
	err = chaosPage.Execute(hf, struct {
		*chaosReport
		Rows               []row
		Outboxes, Restarts []*chaosPolicyReport
		Command            string
	}{rep, rows, outboxes, restarts, chaosCommandLine(rep)})
	if cerr := hf.Close(); err == nil {
		err = cerr
	}
	return err
}

// The chart's colours: one effect (green), none (grey), two or more
// (red); the fault causes in the lower panel (one colour per kind).
var (
	chartBG    = color.RGBA{255, 255, 255, 255}
	chartAxis  = color.RGBA{60, 60, 60, 255}
	chartZero  = color.RGBA{160, 160, 160, 255}
	chartOne   = color.RGBA{46, 139, 87, 255}
	chartMore  = color.RGBA{200, 40, 40, 255}
	chartFault = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {23, 190, 207, 255}, {188, 189, 34, 255}, {127, 127, 127, 255}}
)

// chaosChart draws, per policy, a stacked bar of its keys by effects (0,
// 1, 2+; upper panel) and bars of the duplicates and indeterminate keys
// per fault kind (lower panel). The HTML page carries the legend.
func chaosChart(rep *chaosReport) image.Image {
	const (
		w, h   = 800, 420
		pad    = 30
		barW   = 60
		panelH = 160
	)
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), &image.Uniform{chartBG}, image.Point{}, draw.Src)
	fill := func(x0, y0, x1, y1 int, c color.Color) {
		draw.Draw(img, image.Rect(x0, y0, x1, y1), &image.Uniform{c}, image.Point{}, draw.Src)
	}
	n := max(len(rep.Policies), 1)
	slot := (w - 2*pad) / n
	// Upper panel: keys by effects, as a share of the keys.
	base := pad + panelH
	fill(pad, base, w-pad, base+1, chartAxis)
	for i, p := range rep.Policies {
		x := pad + i*slot + (slot-barW)/2
		y := base
		for _, part := range []struct {
			n int
			c color.Color
		}{{p.KeysWith1, chartOne}, {p.KeysWith0, chartZero}, {p.KeysWith2, chartMore}} {
			hh := part.n * panelH / max(p.Keys, 1)
			if part.n > 0 {
				hh = max(hh, 2)
			}
			fill(x, y-hh, x+barW, y, part.c)
			y -= hh
		}
	}
	// Lower panel: causes per fault kind (duplicates up, indeterminate
	// in a lighter shade beside), scaled to the largest count.
	top := base + 2*pad
	lbase := top + panelH
	fill(pad, lbase, w-pad, lbase+1, chartAxis)
	most := 1
	for _, p := range rep.Policies {
		for _, v := range p.DuplicateCauses {
			most = max(most, v)
		}
		for _, v := range p.IndeterminateWhy {
			most = max(most, v)
		}
	}
	for i, p := range rep.Policies {
		kinds := allChaosFaults
		bw := max(slot/(2*len(kinds)+1), 2)
		for j, f := range kinds {
			c := chartFault[j%len(chartFault)]
			x := pad + i*slot + j*2*bw
			if d := p.DuplicateCauses[f]; d > 0 {
				hh := max(d*panelH/most, 2)
				fill(x, lbase-hh, x+bw, lbase, c)
			}
			if d := p.IndeterminateWhy[f]; d > 0 {
				hh := max(d*panelH/most, 2)
				light := color.RGBA{c.R/2 + 127, c.G/2 + 127, c.B/2 + 127, 255}
				fill(x+bw, lbase-hh, x+2*bw, lbase, light)
			}
		}
	}
	return img
}

func colorHex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

var chaosPage = template.Must(template.New("chaos").Funcs(template.FuncMap{
	"faultColor": func(f string) template.CSS {
		i := slices.Index(allChaosFaults, f)
		if i < 0 {
			return "#000"
		}
		return template.CSS(colorHex(chartFault[i%len(chartFault)]))
	},
	"join":   strings.Join,
	"faults": func() []string { return allChaosFaults },
	"css":    func(c color.RGBA) template.CSS { return template.CSS(colorHex(c)) },
	"one":    func() color.RGBA { return chartOne },
	"zero":   func() color.RGBA { return chartZero },
	"more":   func() color.RGBA { return chartMore },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>idem chaos: seed {{.Seed}}</title>
<style>body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.ok{color:#2e8b57;font-weight:bold}.broken{color:#c82828;font-weight:bold}.sw{display:inline-block;width:1em;height:1em;vertical-align:middle;margin-right:.3em}</style></head>
<body><h1>idem chaos {{if .OK}}<span class="ok">every guarantee kept</span>{{else}}<span class="broken">a guarantee broke</span>{{end}}</h1>
<p>{{.Target}}; {{.Keys}} keys per policy, each published 1-5 times; {{.Workers}} worker processes; faults {{join .Faults ", "}} for {{.Duration}} per policy;
lease {{.Lease}}, visibility {{.Visibility}}.{{if .Broken}} <b>The workers skipped the shared ledger (--broken-ledger).</b>{{end}}<br>
Reproduce: <code>{{.Command}}</code></p>
<table><tr><th>policy</th><th>guarantee</th><th>keys</th><th>messages</th><th>0 effects</th><th>1 effect</th><th>2+ effects</th><th>duplicates</th><th>indeterminate</th><th>listed by ls --stuck</th><th>lost</th><th>dead letters</th><th>msg/s</th><th>drain after last fault</th><th>verdict</th></tr>
{{range .Rows}}<tr><td>{{.Policy}}</td><td style="text-align:left">{{.Guarantee}}</td><td>{{.Keys}}</td><td>{{.Messages}}</td><td>{{.KeysWith0}}</td><td>{{.KeysWith1}}</td><td>{{.KeysWith2}}</td><td>{{.Duplicates}}</td><td>{{.Indeterminate}}</td><td>{{.ListedStuck}}</td><td>{{.Lost}}</td><td>{{.DeadLetters}}</td><td>{{printf "%.0f" .Throughput}}</td><td>{{.DrainAfterFault}}</td>
<td>{{if .OK}}<span class="ok">kept</span>{{else}}<span class="broken">BROKEN ({{.ViolationCount}})</span>{{end}}</td></tr>
{{end}}</table>
<h2>Chart</h2>
<p><img src="chart.png" alt="keys by effects per policy, and causes per fault kind" width="800" height="420"></p>
<p>Upper panel, one bar per policy in the table's order: the share of keys with
<span class="sw" style="background:{{css one}}"></span>1 effect,
<span class="sw" style="background:{{css zero}}"></span>0 effects,
<span class="sw" style="background:{{css more}}"></span>2 or more.
Lower panel, per policy: duplicates (dark) and indeterminate keys (light) caused by each fault kind:
{{range faults}}<span class="sw" style="background:{{faultColor .}}"></span>{{.}} {{end}}</p>
<h2>Per fault kind</h2>
<table><tr><th>policy</th><th>fault</th><th>injected</th><th>duplicates caused</th><th>indeterminate caused</th></tr>
{{range $r := .Rows}}{{range .Kinds}}<tr><td>{{$r.Policy}}</td><td>{{.}}</td><td>{{index $r.FaultsInjected .}}</td><td>{{index $r.DuplicateCauses .}}</td><td>{{index $r.IndeterminateWhy .}}</td></tr>
{{end}}{{end}}</table>
{{if .Outboxes}}<h2>Outbox relay kills</h2>
<p>The producer wrote every message into an outbox; relays killed between a confirmed publish and the outbox ack; the messages published again by the next relay, which the queue dropped by their dedup id (even keys) or delivered, for the consumer's ledger to absorb (odd keys).</p>
<table><tr><th>policy</th><th>outbox written</th><th>relays started</th><th>relay kills</th><th>re-published</th><th>deduplicated by queue</th><th>delivered (ledger absorbed)</th><th>outbox dead letters</th></tr>
{{range .Outboxes}}<tr><td>{{.Policy}}</td><td>{{.Outbox.Written}}</td><td>{{.Outbox.RelaysStarted}}</td><td>{{.Outbox.RelayKills}}</td><td>{{.Outbox.Republished}}</td><td>{{.Outbox.DedupedByTarget}}</td><td>{{.Outbox.Delivered}}</td><td>{{.Outbox.DeadLetters}}</td></tr>
{{end}}</table>{{end}}
{{if .Restarts}}<h2>Store restarts</h2>
<table><tr><th>policy</th><th>store restarts</th><th>longest</th><th>failed</th></tr>
{{range .Restarts}}<tr><td>{{.Policy}}</td><td>{{.Restart.Restarts}}</td><td>{{.Restart.Longest}}</td><td>{{.Restart.Failed}}</td></tr>
{{end}}</table>{{end}}
{{range .Rows}}{{if .Violations}}<h2>{{.Policy}}: violations</h2><ul>{{range .Violations}}<li><code>{{.}}</code></li>{{end}}</ul>{{end}}{{end}}
</body></html>
`))

// chaosCommandLine is the command that repeats rep's run (the store's
// URL aside, which the page names without its password).
func chaosCommandLine(rep *chaosReport) string {
	var policies []string
	for _, p := range rep.Policies {
		policies = append(policies, p.Policy)
	}
	line := fmt.Sprintf("idem chaos --policies %s --faults %s --keys %d --workers %d --duration %s --lease %s --visibility %s --seed %d",
		strings.Join(policies, ","), orNone(rep.Faults), rep.Keys, rep.Workers, rep.Duration, rep.Lease, rep.Visibility, rep.Seed)
	if rep.Handlers != 0 && rep.Handlers != chaosDefaultHandlers {
		line += fmt.Sprintf(" --handlers %d", rep.Handlers)
	}
	if rep.FaultEvery != 0 && rep.FaultEvery != chaosDefaultFaultEvery {
		line += fmt.Sprintf(" --fault-every %d", rep.FaultEvery)
	}
	if rep.CutEvery != "" && rep.CutEvery != chaosDefaultCutEvery.String() {
		line += " --cut-every " + rep.CutEvery
	}
	if rep.Sync != "" && rep.Sync != chaosDefaultSync {
		line += " --synchronous " + rep.Sync
	}
	if rep.FusedOff {
		line += " --fused=false"
	}
	if rep.Queue != "" {
		line += " --queue " + rep.Queue
	}
	if rep.Broken {
		line += " --broken-ledger"
	}
	if slices.Contains(rep.Faults, faultStoreRestart) {
		line += " --restart-store CMD" // the command is the user's, and may hold a password
	}
	return line
}
