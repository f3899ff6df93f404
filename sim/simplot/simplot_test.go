package simplot

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// TestLegendOutsideData checks that the legend's box lies right of the
// data area, for legends of one to many entries and long names.
func TestLegendOutsideData(t *testing.T) {
	cases := []struct {
		name    string
		entries []string
	}{
		{"one", []string{"switchyard"}},
		{"policies", []string{"round-robin", "random", "nearest", "proportional", "p2c", "prefix-affinity", "feedback-loop", "switchyard"}},
		{"long names", []string{"engine a-very-long-engine-name-in-region-eu-west-1", "engine B"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := plot.New()
			p.Title.Text = "t"
			l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 1}})
			if err != nil {
				t.Fatal(err)
			}
			p.Add(l)
			for _, e := range tc.entries {
				p.Legend.Add(e, l)
			}
			dc := draw.New(vgimg.New(8*vg.Inch, 5*vg.Inch))
			leg := p.Legend
			pc, lc, ok := split(&leg, dc)
			if !ok {
				t.Fatal("no legend strip for a legend with entries")
			}
			data := p.DataCanvas(pc)
			box := leg.Rectangle(lc)
			if box.Min.X < data.Max.X {
				t.Errorf("legend box starts at x=%v, inside the data area (ends at x=%v)", box.Min.X, data.Max.X)
			}
			if box.Max.X > dc.Max.X || data.Max.X-data.Min.X < dc.Size().X/3 {
				t.Errorf("legend box %v or data area %v..%v does not fit the %v wide canvas", box, data.Min.X, data.Max.X, dc.Size().X)
			}
		})
	}
}

// TestEngineLabel checks that engines are never named like clusters.
func TestEngineLabel(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"A", "engine A"}, {"engine-a", "engine-a"}, {"gpu-1", "engine gpu-1"}, {"Engine7", "Engine7"},
	} {
		if got := engineLabel(tc.in); got != tc.want {
			t.Errorf("engineLabel(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestSavePNG checks that a plot is written as a PNG of the asked size.
func TestSavePNG(t *testing.T) {
	p := plot.New()
	l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 1}})
	if err != nil {
		t.Fatal(err)
	}
	p.Add(l)
	p.Legend.Add("engine A", l)
	path := filepath.Join(t.TempDir(), "x.png")
	if err := savePNG(p, 4*vg.Inch, 3*vg.Inch, path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() != 4*vgimg.DefaultDPI || b.Dy() != 3*vgimg.DefaultDPI {
		t.Errorf("image is %dx%d, want %dx%d", b.Dx(), b.Dy(), 4*vgimg.DefaultDPI, 3*vgimg.DefaultDPI)
	}
	if w := p.Legend.Rectangle(draw.New(vgimg.New(vg.Inch, vg.Inch))).Size().X; w <= 0 {
		t.Errorf("savePNG left the plot without its legend")
	}
}
