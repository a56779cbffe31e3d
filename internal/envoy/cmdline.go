package envoy

import "strings"

// DrainTellsAtOnce reports whether an Envoy started with args (its
// command line, the program's name excluded) tells every client to go
// with its first response once a drain begins: --drain-strategy
// immediate (Istio's pilot-agent passes it, as the deploy/ manifests do),
// or --drain-time-s 0. Envoy's default strategy, gradual, tells only a
// share growing over the drain time (its drain manager closes a
// connection with probability elapsed/drain time), so a response after the
// drain began proves nothing then. Flags are read as Envoy's parser takes
// them: "--flag value" or "--flag=value", the last one standing.
func DrainTellsAtOnce(args []string) bool {
	strategy, drainTime := "gradual", ""
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(args[i], "=")
		if name != "--drain-strategy" && name != "--drain-time-s" {
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				break
			}
			i++
			val = args[i]
		}
		if name == "--drain-strategy" {
			strategy = val
		} else {
			drainTime = val
		}
	}
	return strategy == "immediate" || strings.Trim(drainTime, "0") == "" && drainTime != ""
}
