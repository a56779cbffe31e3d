package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/draind/draind/internal/drain"
)

// callWait calls GET /wait/out-of-rotation on h in a goroutine; the
// answer arrives on the channel.
func callWait(h http.Handler) <-chan *httptest.ResponseRecorder {
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "http://192.0.2.1:15020"+RotationWaitPath, nil))
		done <- rec
	}()
	return done
}

func TestWaitOutOfRotation(t *testing.T) {
	newServer := func(b *fakeBackend, lim statusLimits) http.Handler {
		return newStatusServerLimits(b, nil, lim).srv.Handler
	}
	t.Run("a Ready pod: no drain after the begin wait, and none started", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{}
			b.setState(drain.State{Phase: drain.Ready})
			start := time.Now()
			lim := defaultStatusLimits
			lim.DrainBeginWait = 4 * time.Second // --drain-begin-wait
			rec := <-callWait(newServer(b, lim))
			if took := time.Since(start); took != lim.DrainBeginWait {
				t.Errorf("answered after %s, want %s", took, lim.DrainBeginWait)
			}
			if rec.Code != 200 || rec.Header().Get("Draind-Outcome") != "no-drain" {
				t.Errorf("%d %q %q", rec.Code, rec.Header().Get("Draind-Outcome"), rec.Body)
			}
			if c := b.took(); len(c) != 0 {
				t.Errorf("the wait changed something: %v", c)
			}
		})
	})
	t.Run("called before SIGTERM reaches draind, answered at the rotation's end", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{}
			b.setState(drain.State{Phase: drain.Ready})
			answer := callWait(newServer(b, defaultStatusLimits))
			time.Sleep(300 * time.Millisecond) // the kubelet signals draind a moment later
			b.setState(drain.State{Phase: drain.Draining, Cause: drain.CauseSignal})
			time.Sleep(drain.DefaultDrainBeginWait + time.Second) // longer than the begin wait: the drain began
			synctest.Wait()
			select {
			case rec := <-answer:
				t.Fatalf("answered while draining: %d %q", rec.Code, rec.Body)
			default:
			}
			b.setState(drain.State{Phase: drain.Gating, Cause: drain.CauseSignal,
				Rotation: &drain.RotationEnd{Took: 5300 * time.Millisecond, Why: drain.RotationQuiet, Account: "quiet for 1s after 40 new connections"}})
			rec := <-answer
			if rec.Code != 200 || rec.Header().Get("Draind-Outcome") != "out-of-rotation" || !strings.Contains(rec.Body.String(), "40 new connections") {
				t.Errorf("%d %q %q", rec.Code, rec.Header().Get("Draind-Outcome"), rec.Body)
			}
		})
	})
	t.Run("before the machine exists", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{} // detached
			answer := callWait(newServer(b, defaultStatusLimits))
			time.Sleep(100 * time.Millisecond)
			b.setState(drain.State{Phase: drain.Gating, Cause: drain.CauseSignal, Held: []drain.HeldFor{{Kind: drain.HoldMinDrain, For: time.Second}}})
			if rec := <-answer; rec.Header().Get("Draind-Outcome") != "out-of-rotation" {
				t.Errorf("%d %q", rec.Code, rec.Body)
			}
		})
	})
}
