package cli

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/sockdiag"
	"golang.org/x/sys/unix"
)

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	socks := []sockdiag.Socket{
		{Family: unix.AF_INET, State: sockdiag.Listen, Local: netip.MustParseAddrPort("0.0.0.0:8080"), Remote: netip.MustParseAddrPort("0.0.0.0:0"), Inode: 5, Cookie: 1},
		{Family: unix.AF_INET6, State: sockdiag.Established, Local: netip.MustParseAddrPort("[::1]:8080"), Remote: netip.MustParseAddrPort("[::1]:4000"), UID: 1337, Inode: 6, Cookie: 1 << 40, CgroupID: 77, HasInfo: true, LastDataSent: time.Second, LastDataRecv: 2 * time.Second},
		{Family: unix.AF_INET, State: sockdiag.TimeWait, Local: netip.MustParseAddrPort("127.0.0.1:4001"), Remote: netip.MustParseAddrPort("127.0.0.1:8080")},
		{Family: unix.AF_INET, State: sockdiag.Established, Transparent: true, UID: 1337, Local: netip.MustParseAddrPort("127.0.0.1:4002"), Remote: netip.MustParseAddrPort("127.0.0.1:9"), HasInfo: true, LastDataSent: time.Hour, LastDataRecv: time.Hour},
	}
	p := flows.DefaultPolicy()
	p.IdleTimeout = time.Minute
	snap := flows.NewClassifier(p).Classify(socks)
	snap.Taken = time.Date(2026, 11, 22, 7, 0, 0, 123, time.UTC)
	snap.Namespace = `pid "42"`
	want, err := json.Marshal(&snap)
	if err != nil {
		t.Fatal(err)
	}
	got := AppendJSON(nil, &snap)
	var a, b any
	if err := json.Unmarshal(want, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &b); err != nil {
		t.Fatalf("AppendJSON output is not JSON: %v\n%s", err, got)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("AppendJSON differs from encoding/json:\n got %s\nwant %s", got, want)
	}
	var empty flows.Snapshot
	if err := json.Unmarshal(AppendJSON(nil, &empty), &b); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, &snap); err != nil || !strings.Contains(buf.String(), "idle") {
		t.Fatalf("table: %v\n%s", err, buf.String())
	}
}
