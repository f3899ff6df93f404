package dashboard

import "github.com/switchyard-dev/switchyard/router"

// RouterStatuses adapts in-process routers to Options.Routers: one
// RouterStatus per router and model it serves (one with no model for a
// router that serves none yet), from the router's readiness detail.
// routers is called on every use, so a method value such as
// (*stack.Stack).Routers can be passed as is.
func RouterStatuses(routers func() []*router.Service) func() []RouterStatus {
	return func() []RouterStatus {
		var out []RouterStatus
		for _, r := range routers() {
			rd := r.Handler().Readiness()
			if len(rd.Models) == 0 {
				out = append(out, RouterStatus{Cluster: rd.Cluster, Router: rd.Router, AgeSeconds: -1, Mode: string(rd.Mode)})
				continue
			}
			for model, m := range rd.Models {
				age := -1.0
				if m.SnapshotAgeSeconds != nil {
					age = *m.SnapshotAgeSeconds
				}
				out = append(out, RouterStatus{Cluster: rd.Cluster, Router: rd.Router, Model: model,
					Generation: m.Generation, AgeSeconds: age, Mode: string(m.Mode)})
			}
		}
		return out
	}
}
