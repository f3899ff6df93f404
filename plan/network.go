package plan

// Defaults of the network latency assumed between a cluster and an engine
// before any is measured or configured, one-way, ms. They only place a new
// engine in the plan (an engine of no known latency would not be planned
// at all) and order it against measured ones until the routers' RTT
// reports replace them, a few report intervals later.
const (
	// DefaultSameRegionMs: a frontend and an engine of one region talk
	// across a data centre or between its zones, well under a millisecond
	// to about one one-way; one keeps a same-region engine ahead of any
	// engine elsewhere.
	DefaultSameRegionMs = 1.0
	// DefaultOtherRegionMs: between regions of one continent the one-way
	// latency is some 10 to 40 ms (across the US about 30, within Europe
	// 10 to 20), between continents 40 to 150; 30 ranks an engine of
	// another region behind every same-region one yet keeps it a
	// candidate for overflow, as a measured cross-region engine would be.
	DefaultOtherRegionMs = 30.0
)

// RegionLatency is the network latency the plan assumes by region until
// one is measured or configured.
type RegionLatency struct {
	// SameRegionMs and OtherRegionMs are the one-way latency, ms, between a
	// cluster and an engine of the same region and of different regions.
	SameRegionMs, OtherRegionMs float64
}

// WithDefaults returns r with each zero field set to its default.
func (r RegionLatency) WithDefaults() RegionLatency {
	if r.SameRegionMs == 0 {
		r.SameRegionMs = DefaultSameRegionMs
	}
	if r.OtherRegionMs == 0 {
		r.OtherRegionMs = DefaultOtherRegionMs
	}
	return r
}

// Ms returns the latency assumed between a cluster of region cluster and
// an engine of region engine. A region that is not known (empty) counts
// as another region: such an engine is planned, behind the engines known
// to be near.
func (r RegionLatency) Ms(cluster, engine string) float64 {
	if cluster != "" && cluster == engine {
		return r.SameRegionMs
	}
	return r.OtherRegionMs
}

// Network is where a problem's network latency comes from, in order: the
// latency measured by routers, the configured latency, and the region
// default. Its Latency method is an Input.Network.
type Network struct {
	// Measured returns the measured latency from a cluster to an engine, ms,
	// and whether one is measured; nil means none is.
	Measured func(cluster, engine string) (float64, bool)
	// Configured is the configured latency by cluster and engine, ms.
	Configured map[string]map[string]float64
	// PreferConfigured uses Configured even where a latency is measured.
	PreferConfigured bool
	// ClusterRegion and EngineRegion return a cluster's and an engine's
	// region ("" when unknown); nil means unknown.
	ClusterRegion, EngineRegion func(name string) string
	// Regions is the latency assumed by region when neither a measured nor
	// a configured one exists; with NoRegionDefault such an engine is not
	// planned for the cluster.
	Regions         RegionLatency
	NoRegionDefault bool
}

// Latency returns the latency from cluster to engine, ms, and false when
// none is known (only with NoRegionDefault).
func (n Network) Latency(cluster, engine string) (float64, bool) {
	var ms float64
	ok := false
	if n.Measured != nil {
		ms, ok = n.Measured(cluster, engine)
	}
	if cms, has := n.Configured[cluster][engine]; has && (!ok || n.PreferConfigured) {
		return cms, true
	}
	if ok || n.NoRegionDefault {
		return ms, ok
	}
	var cr, er string
	if n.ClusterRegion != nil {
		cr = n.ClusterRegion(cluster)
	}
	if n.EngineRegion != nil {
		er = n.EngineRegion(engine)
	}
	return n.Regions.Ms(cr, er), true
}
