package main

import (
	"strings"
	"testing"
)

// A stream as go test -json writes it: a passing package with a skip, a
// failing test, a package whose test a timeout cut short.
const stream = `{"Action":"start","Package":"github.com/draind/draind/internal/a"}
{"Action":"run","Package":"github.com/draind/draind/internal/a","Test":"TestPass"}
{"Action":"output","Package":"github.com/draind/draind/internal/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/a","Test":"TestPass","Output":"    a_test.go:9: passing chatter\n"}
{"Action":"pass","Package":"github.com/draind/draind/internal/a","Test":"TestPass"}
{"Action":"output","Package":"github.com/draind/draind/internal/a","Test":"TestPeer","Output":"=== RUN   TestPeer\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/a","Test":"TestPeer","Output":"    a_test.go:20: the pilot-agent peer is not built: make peers\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/a","Test":"TestPeer","Output":"--- SKIP: TestPeer (0.00s)\n"}
{"Action":"skip","Package":"github.com/draind/draind/internal/a","Test":"TestPeer"}
{"Action":"output","Package":"github.com/draind/draind/internal/a","Output":"PASS\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/a","Output":"ok  \tgithub.com/draind/draind/internal/a\t0.1s\n"}
{"Action":"pass","Package":"github.com/draind/draind/internal/a"}
{"Action":"output","Package":"github.com/draind/draind/internal/b","Test":"TestFail","Output":"=== RUN   TestFail\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/b","Test":"TestFail","Output":"    b_test.go:7: got 1, want 2\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/b","Test":"TestFail","Output":"--- FAIL: TestFail (0.00s)\n"}
{"Action":"fail","Package":"github.com/draind/draind/internal/b","Test":"TestFail"}
{"Action":"output","Package":"github.com/draind/draind/internal/b","Test":"TestPeer2","Output":"    b_test.go:30: the pilot-agent peer is not built: make peers\n"}
{"Action":"skip","Package":"github.com/draind/draind/internal/b","Test":"TestPeer2"}
{"Action":"output","Package":"github.com/draind/draind/internal/b","Test":"TestStuck","Output":"=== RUN   TestStuck\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/b","Test":"TestStuck","Output":"panic: test timed out after 1s\n"}
{"Action":"output","Package":"github.com/draind/draind/internal/b","Output":"FAIL\tgithub.com/draind/draind/internal/b\t1.0s\n"}
{"Action":"fail","Package":"github.com/draind/draind/internal/b"}
`

func TestSummary(t *testing.T) {
	var out strings.Builder
	s := newSummary(&out)
	if err := s.read(strings.NewReader(stream)); err != nil {
		t.Fatal(err)
	}
	s.printSkips()
	want := "ok  \tgithub.com/draind/draind/internal/a\t0.1s\n" +
		"=== RUN   TestFail\n    b_test.go:7: got 1, want 2\n--- FAIL: TestFail (0.00s)\n" +
		"=== RUN   TestStuck\npanic: test timed out after 1s\n" +
		"FAIL\tgithub.com/draind/draind/internal/b\t1.0s\n" +
		"\nskipped (2):\n" +
		"  the pilot-agent peer is not built: make peers\n" +
		"      internal/a.TestPeer internal/b.TestPeer2\n"
	if got := out.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if !s.failed {
		t.Error("a failed test did not fail the summary")
	}
}

// The exit status is the command's.
func TestExitStatus(t *testing.T) {
	var out strings.Builder
	if got := run([]string{"sh", "-c", "echo not json; exit 3"}, &out, &out); got != 3 {
		t.Errorf("exit %d, want 3", got)
	}
	if out.String() != "not json\n" {
		t.Errorf("output %q", out.String())
	}
	if got := run([]string{"true"}, &out, &out); got != 0 {
		t.Errorf("exit %d, want 0", got)
	}
}
