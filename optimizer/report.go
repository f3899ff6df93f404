package optimizer

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Report is the JSON rendering of a solution. Numbers that are not finite (the latency of an
// engine loaded beyond capacity by a baseline policy) are rendered as null.
type Report struct {
	Policy        string                   `json:"policy"`
	MeanLatencyMs *float64                 `json:"mean_latency_ms"`
	ShedRPS       float64                  `json:"shed_rps"`
	Clusters      map[string]ClusterReport `json:"clusters"`
	Engines       map[string]EngineReport  `json:"engines"`
	Diagnostics   DiagnosticsReport        `json:"diagnostics"`
}

// ClusterReport is one cluster in a Report; the weights sum to 1 - shed_fraction and list only
// engines with a positive weight.
type ClusterReport struct {
	Weights        map[string]float64 `json:"weights"`
	ShedFraction   float64            `json:"shed_fraction"`
	MeanLatencyMs  *float64           `json:"mean_latency_ms"`
	DemandRPS      float64            `json:"demand_rps"`
	ShedRPS        float64            `json:"shed_rps"`
	ShedByPriority map[string]float64 `json:"shed_by_priority_rps"`
}

// EngineReport is one engine in a Report; latency_ms is engine-side only.
type EngineReport struct {
	LoadRPS     float64  `json:"load_rps"`
	Utilisation *float64 `json:"utilisation"`
	LatencyMs   *float64 `json:"latency_ms"`
	CapacityRPS float64  `json:"capacity_rps"`
}

// DiagnosticsReport is the diagnostics part of a Report.
type DiagnosticsReport struct {
	Objective  *float64 `json:"objective"`
	Gap        *float64 `json:"gap"`
	RelGap     *float64 `json:"relative_gap"`
	Converged  bool     `json:"converged"`
	Iterations int      `json:"iterations"`
	Path       string   `json:"path,omitempty"`
	DurationMs float64  `json:"duration_ms"`
	Notes      []string `json:"notes"`
}

// Report returns the solution in the shape of the JSON output.
func (s *Solution) Report() *Report {
	r := &Report{
		Policy:        s.Policy,
		MeanLatencyMs: finite(s.MeanLatencyMs),
		ShedRPS:       s.ShedRPS,
		Clusters:      make(map[string]ClusterReport, len(s.Clusters)),
		Engines:       make(map[string]EngineReport, len(s.Engines)),
		Diagnostics: DiagnosticsReport{
			Objective:  finite(s.Diagnostics.Objective),
			Gap:        finite(s.Diagnostics.Gap),
			RelGap:     finite(s.Diagnostics.RelGap),
			Converged:  s.Diagnostics.Converged,
			Iterations: s.Diagnostics.Iterations,
			Path:       s.Diagnostics.Path,
			DurationMs: float64(s.Diagnostics.Duration.Microseconds()) / 1000,
			Notes:      append([]string{}, s.Diagnostics.Notes...),
		},
	}
	for i := range s.Clusters {
		c := &s.Clusters[i]
		cr := ClusterReport{
			Weights:        map[string]float64{},
			ShedFraction:   c.ShedFraction,
			MeanLatencyMs:  finite(c.MeanLatencyMs),
			DemandRPS:      c.DemandRPS,
			ShedRPS:        c.ShedRPS,
			ShedByPriority: map[string]float64{},
		}
		for k, j := range c.Engines {
			if c.Weights[k] > 0 {
				cr.Weights[s.Engines[j].Name] = c.Weights[k]
			}
		}
		for q := Critical; q < NumPriorities; q++ {
			cr.ShedByPriority[q.String()] = c.ShedByPriority[q]
		}
		r.Clusters[c.Name] = cr
	}
	for j := range s.Engines {
		e := &s.Engines[j]
		r.Engines[e.Name] = EngineReport{LoadRPS: e.LoadRPS, Utilisation: finite(e.Utilisation), LatencyMs: finite(e.LatencyMs), CapacityRPS: e.CapacityRPS}
	}
	return r
}

// JSON renders the solution as indented JSON with sorted keys.
func (s *Solution) JSON() ([]byte, error) {
	b, err := json.MarshalIndent(s.Report(), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("optimizer: rendering solution as JSON: %w", err)
	}
	return append(b, '\n'), nil
}

func fmtNum(v float64, prec int) string {
	if math.IsInf(v, 1) {
		return "inf"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// WriteTable writes the solution as human-readable tables: clusters with their weights, then
// engines with their loads, then a summary and the notes.
func WriteTable(w io.Writer, s *Solution) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CLUSTER\tDEMAND RPS\tSHED\tMEAN MS\tWEIGHTS\n")
	for i := range s.Clusters {
		c := &s.Clusters[i]
		var ws []string
		for k, j := range c.Engines {
			if c.Weights[k] > 0 {
				ws = append(ws, fmt.Sprintf("%s=%.4f", s.Engines[j].Name, c.Weights[k]))
			}
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.4f\t%s\t%s\n", c.Name, c.DemandRPS, c.ShedFraction, fmtNum(c.MeanLatencyMs, 1), strings.Join(ws, " "))
	}
	fmt.Fprintf(tw, "\nENGINE\tCAPACITY RPS\tLOAD RPS\tUTILISATION\tLATENCY MS\n")
	for j := range s.Engines {
		e := &s.Engines[j]
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%s\t%s\n", e.Name, e.CapacityRPS, e.LoadRPS, fmtNum(e.Utilisation, 4), fmtNum(e.LatencyMs, 1))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("optimizer: writing table: %w", err)
	}
	d := &s.Diagnostics
	_, err := fmt.Fprintf(w, "\npolicy %s: mean latency %s ms over served traffic, %.4g req/s shed; relative gap %.3g, %d sweeps, %v\n",
		s.Policy, fmtNum(s.MeanLatencyMs, 2), s.ShedRPS, d.RelGap, d.Iterations, d.Duration)
	for _, n := range d.Notes {
		if err == nil {
			_, err = fmt.Fprintf(w, "note: %s\n", n)
		}
	}
	if err != nil {
		return fmt.Errorf("optimizer: writing table: %w", err)
	}
	return nil
}
