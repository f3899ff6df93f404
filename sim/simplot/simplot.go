// Package simplot draws a simulation report as PNG files with gonum/plot:
// latency CDFs per policy, each engine's traffic share over time per policy,
// and engine utilisation over time per policy.
package simplot

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/switchyard-dev/switchyard/sim"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// maxLegend is the most engines a time-series plot names in its legend.
const maxLegend = 12

// Write draws the report's plots into dir (created if needed) and returns
// the files written.
func Write(dir string, rep *sim.Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("simplot: %w", err)
	}
	var files []string
	save := func(p *plot.Plot, name string, w, h vg.Length) error {
		path := filepath.Join(dir, name)
		if err := p.Save(w, h, path); err != nil {
			return fmt.Errorf("simplot: %s: %w", path, err)
		}
		files = append(files, path)
		return nil
	}
	for _, which := range []string{"ttft", "e2e"} {
		p, err := cdf(rep, which)
		if err != nil {
			return files, err
		}
		if err := save(p, which+"_cdf.png", 8*vg.Inch, 5*vg.Inch); err != nil {
			return files, err
		}
	}
	for _, name := range rep.Order {
		res := rep.Policies[name]
		for _, kind := range []string{"share", "utilisation"} {
			p, err := series(rep, &res, kind)
			if err != nil {
				return files, err
			}
			if err := save(p, fmt.Sprintf("%s_%s.png", kind, fileName(name)), 9*vg.Inch, 5*vg.Inch); err != nil {
				return files, err
			}
		}
	}
	return files, nil
}

func fileName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == ' ' {
			return '_'
		}
		return r
	}, s)
}

// cdf plots the CDF of TTFT or end-to-end latency of every policy on a log axis.
func cdf(rep *sim.Report, which string) (*plot.Plot, error) {
	p := plot.New()
	label := map[string]string{"ttft": "time to first token", "e2e": "end-to-end latency"}[which]
	p.Title.Text = fmt.Sprintf("%s: %s CDF", rep.Scenario, label)
	p.X.Label.Text = label + " (ms, log scale)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	var args []any
	for _, name := range rep.Order {
		res := rep.Policies[name]
		data := res.E2ESorted
		if which == "ttft" {
			data = res.TTFTSorted
		}
		if len(data) == 0 {
			continue
		}
		const points = 400
		n := min(points, len(data))
		xy := make(plotter.XYs, 0, n)
		for k := 0; k < n; k++ {
			i := int(float64(k) / float64(n-1) * float64(len(data)-1))
			if n == 1 {
				i = 0
			}
			x := math.Max(float64(data[i]), 0.1)
			xy = append(xy, plotter.XY{X: x, Y: float64(i+1) / float64(len(data))})
		}
		args = append(args, name, xy)
	}
	if err := plotutil.AddLines(p, args...); err != nil {
		return nil, fmt.Errorf("simplot: %s CDF: %w", which, err)
	}
	return p, nil
}

// series plots each engine's traffic share or utilisation over time for one policy.
func series(rep *sim.Report, res *sim.Result, kind string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %s — engine %s over time", rep.Scenario, res.Policy, kind)
	p.X.Label.Text = "time (s)"
	if kind == "share" {
		p.Y.Label.Text = "share of dispatched requests"
	} else {
		p.Y.Label.Text = "utilisation (dispatch rate / capacity)"
	}
	p.Y.Min = 0
	for j, e := range rep.Engines {
		xy := make(plotter.XYs, 0, len(res.Samples))
		for _, s := range res.Samples {
			v := s.Share[j]
			if kind != "share" {
				v = s.Utilisation[j]
			}
			xy = append(xy, plotter.XY{X: s.TimeS, Y: v})
		}
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, fmt.Errorf("simplot: %s %s: %w", res.Policy, kind, err)
		}
		l.Color = plotutil.Color(j)
		l.Dashes = plotutil.Dashes(j / 7)
		p.Add(l)
		if len(rep.Engines) <= maxLegend {
			p.Legend.Add(e.Name, l)
		}
	}
	return p, nil
}
