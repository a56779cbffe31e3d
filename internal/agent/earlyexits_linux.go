package agent

import (
	"errors"

	"go.uber.org/zap"

	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/kubeevents"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/probes"
)

// earlyExits is the recorder of the pod's other containers' exits
// (probes.EarlyExits) as appprocs.WithEarlyExits takes it.
type earlyExits struct{ rec *probes.EarlyExits }

// openEarlyExits starts the recorder first thing under --exit-with-app,
// so that an app container that runs and leaves during draind's start-up
// (its process source is live a tenth of a second to seconds after exec)
// leaves its exit code (docs/design.md, "An app draind never saw"). Only
// in a Kubernetes pod (POD_UID, the downward API's), where the parent of
// a container's cgroup is its pod's: elsewhere the parent holds unrelated
// processes. nil when it does not run; the log line says why.
func (a *agent) openEarlyExits() *earlyExits {
	if !a.watchesAppWhileReady() || a.cfg.AppProcs == appprocs.ModeOff || a.cfg.AppProcs == appprocs.ModeProc {
		return nil
	}
	if uid, _ := a.cfg.lookupEnv(kubeevents.PodUIDEnv); uid == "" {
		a.log.Info("early exits", logevent.EarlyExits.Field(), zap.Bool("recording", false), zap.String("why", kubeevents.PodUIDEnv+" unset: not known to be a Kubernetes pod"))
		return nil
	}
	rec, err := probes.OpenEarlyExits()
	if err != nil {
		why := err.Error()
		var ue *probes.UnavailableError
		if errors.As(err, &ue) {
			why = ue.Reason
		}
		a.log.Info("early exits", logevent.EarlyExits.Field(), zap.Bool("recording", false), zap.String("why", why))
		return nil
	}
	a.log.Info("early exits", logevent.EarlyExits.Field(), zap.Bool("recording", true), zap.Uint64("pod_cgroup", rec.Pod), zap.Uint64("own_cgroup", rec.Own))
	return &earlyExits{rec: rec}
}

// EarlyExits converts the records that are ends into appprocs's terms.
func (e *earlyExits) EarlyExits() ([]appprocs.EarlyExit, error) {
	recs, _, err := e.rec.Exits()
	if err != nil {
		return nil, err
	}
	out := make([]appprocs.EarlyExit, 0, len(recs))
	for _, r := range recs {
		if !r.Ended() {
			continue
		}
		out = append(out, appprocs.EarlyExit{Ktime: r.Ktime, Container: r.Container, PID: r.TGID, Comm: r.Comm, Status: waitStatus(r.Code, r.Status)})
	}
	return out, nil
}

// waitStatus is the wait(2) status a SIGCHLD's si_code and si_status
// stand for.
func waitStatus(code, status int) appprocs.ExitStatus {
	switch code {
	case probes.CLDKilled:
		return appprocs.ExitStatus(status & 0x7f)
	case probes.CLDDumped:
		return appprocs.ExitStatus(status&0x7f | 0x80)
	}
	return appprocs.ExitStatus((status & 0xff) << 8)
}

// Close stops the recorder; safe on nil.
func (e *earlyExits) Close() error {
	if e == nil {
		return nil
	}
	return e.rec.Close()
}
