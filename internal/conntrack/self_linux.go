package conntrack

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// SelfSocketInodes returns the inodes of the sockets this process holds
// open (from /proc/self/fd), so that draind's own sockets count as the
// proxy's whatever uid draind runs under.
func SelfSocketInodes() (map[uint32]struct{}, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("list own fds: %w", err)
	}
	out := make(map[uint32]struct{}, len(ents))
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // closed since ReadDir: fine
		}
		if s, ok := strings.CutPrefix(l, "socket:["); ok {
			if n, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 32); err == nil {
				out[uint32(n)] = struct{}{}
			}
		}
	}
	return out, nil
}
