package optimizer

import (
	"math/rand/v2"
)

// caseStudy returns the case study of the foundation issue with queue profiles.
func caseStudy() *Problem {
	q := QueueProfile{BaseMs: 400}
	p := &Problem{
		Clusters: []Cluster{
			{Name: "A", Demand: [3]float64{Standard: 90}},
			{Name: "B", Demand: [3]float64{Standard: 120}},
			{Name: "C", Demand: [3]float64{Standard: 40}},
		},
		Engines: []Engine{
			{Name: "engine-a", CapacityRPS: 100, Health: 1, Profile: q},
			{Name: "engine-b", CapacityRPS: 100, Health: 1, Profile: q},
			{Name: "engine-c", CapacityRPS: 80, Health: 1, Profile: q},
		},
	}
	for i := 0; i < 3; i++ {
		row := make([]Link, 3)
		for j := range row {
			row[j] = Link{Engine: j, Ms: 5}
			if i == j {
				row[j].Ms = 1
			}
		}
		p.Network = append(p.Network, row)
	}
	return p
}

// randomProblem builds a deterministic random problem with nc clusters, ne engines, each cluster
// eligible for min(ne, elig) engines, queue profiles, total demand load × total capacity.
func randomProblem(seed uint64, nc, ne, elig int, load float64) *Problem {
	r := rand.New(rand.NewPCG(seed, 7))
	p := &Problem{}
	totalCap := 0.0
	for j := 0; j < ne; j++ {
		c := 50 + 100*r.Float64()
		totalCap += c
		p.Engines = append(p.Engines, Engine{Name: "e" + itoa(j), CapacityRPS: c, Health: 1, Profile: QueueProfile{BaseMs: 200 + 400*r.Float64()}})
	}
	ws := make([]float64, nc)
	sum := 0.0
	for i := range ws {
		ws[i] = 0.5 + r.Float64()
		sum += ws[i]
	}
	for i := 0; i < nc; i++ {
		p.Clusters = append(p.Clusters, Cluster{Name: "c" + itoa(i), Demand: [3]float64{Standard: load * totalCap * ws[i] / sum}})
		row := make([]Link, 0, elig)
		if elig >= ne {
			for j := 0; j < ne; j++ {
				row = append(row, Link{Engine: j, Ms: 1 + 49*r.Float64()})
			}
		} else {
			// a window of engines around a home position, like regions
			home := i * ne / nc
			for k := 0; k < elig; k++ {
				j := (home + k*ne/(elig*4) + k) % ne
				row = append(row, Link{Engine: j, Ms: 1 + float64(k)*0.5 + 5*r.Float64()})
			}
			sortLinks(row)
		}
		p.Network = append(p.Network, row)
	}
	return p
}

func sortLinks(row []Link) {
	for a := 1; a < len(row); a++ {
		for b := a; b > 0 && row[b].Engine < row[b-1].Engine; b-- {
			row[b], row[b-1] = row[b-1], row[b]
		}
	}
	// drop duplicates
	out := row[:0]
	for k, l := range row {
		if k > 0 && l.Engine == row[k-1].Engine {
			continue
		}
		out = append(out, l)
	}
	_ = out
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{digits[i%10]}, b...)
	}
	return string(b)
}
