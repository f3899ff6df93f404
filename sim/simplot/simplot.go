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

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/switchyard-dev/switchyard/sim"
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
		if err := savePNG(p, w, h, path); err != nil {
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

// legendGap is the space between the data area and the legend beside it.
const legendGap = 4 * vg.Millimeter

// savePNG writes p as a w×h PNG with its legend to the right of the plot,
// outside the data area, where it can hide no curve (see split).
func savePNG(p *plot.Plot, w, h vg.Length, path string) error {
	leg := p.Legend
	p.Legend = plot.NewLegend()
	defer func() { p.Legend = leg }()
	img := vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	dc := draw.New(img)
	if p.BackgroundColor != nil {
		dc.SetColor(p.BackgroundColor)
		dc.Fill(dc.Rectangle.Path())
	}
	pc, lc, ok := split(&leg, dc)
	p.Draw(pc)
	if ok {
		leg.Draw(lc)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// split divides dc into the plot's canvas and, at its right, the legend's
// (ok false when the legend is empty: the plot has all of dc); it sets the
// legend to its strip's top right.
func split(leg *plot.Legend, dc draw.Canvas) (plotC, legC draw.Canvas, ok bool) {
	lw := leg.Rectangle(dc).Size().X
	if lw <= 0 {
		return dc, draw.Canvas{}, false
	}
	lw += legendGap
	leg.Top, leg.Left, leg.XOffs, leg.YOffs = true, false, 0, 0
	return draw.Crop(dc, 0, -lw, 0, 0), draw.Crop(dc, dc.Size().X-lw, 0, 0, 0), true
}

// engineLabel names an engine in a legend so that it cannot be taken for a
// cluster of the same name (scenarios may call both "A"): "engine A",
// unless its own name says it is one.
func engineLabel(name string) string {
	if strings.Contains(strings.ToLower(name), "engine") {
		return name
	}
	return "engine " + name
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
			p.Legend.Add(engineLabel(e.Name), l)
		}
	}
	return p, nil
}
