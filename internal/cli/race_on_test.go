//go:build race

package cli

// raceEnabled: the race detector multiplies memory; RSS bounds do not hold.
const raceEnabled = true
