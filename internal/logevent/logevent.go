// Package logevent names the lines of draind's log that tests, scripts and
// dashboards look for. Such a line carries a field, [Key], whose value is
// one of the events below: the message is prose for people and may be
// reworded; the event stays. Product code logs with [Event.Field], tests
// match on [Key] with the same constants, so an event is named once.
package logevent

import "go.uber.org/zap"

// Key is the field that names a line's event.
const Key = "event"

// Event is one kind of log line.
type Event string

// Field is the zap field that marks a line as e.
func (e Event) Field() zap.Field { return zap.String(Key, string(e)) }

// The drain machine's events (package drain).
const (
	// Phase says the machine entered a phase (field phase).
	Phase Event = "phase"
	// GateHolds says what holds the gate changed.
	GateHolds Event = "gate_holds"
	// TriggerIgnored says a trigger came while already draining.
	TriggerIgnored Event = "trigger_ignored"
	// SigtermEndsMinDrain marks a native sidecar's SIGTERM after the
	// preStop drain, the app gone: the min-drain ends.
	SigtermEndsMinDrain Event = "sigterm_ends_min_drain"
	// OutOfRotation says --min-drain auto's wait ended (fields took, why:
	// quiet, floor or ceiling, connections, window).
	OutOfRotation Event = "out_of_rotation"
	// UntoldClosed says that, as the min-drain ended, Envoy's downstream
	// keep-alives idle since before its drain began were shut (a FIN to
	// each client) (fields found, closed; error when some were not).
	UntoldClosed Event = "untold_closed"
	// AppGoneEndsAwait says a native sidecar drained from its preStop hook
	// saw the app gone before the kubelet's SIGTERM: it no longer waits for
	// it (field min_drain_ended: the min-drain was still running).
	AppGoneEndsAwait Event = "app_gone_ends_await"
	// SigtermAfterPrestop marks a native sidecar's SIGTERM after the
	// preStop drain: the gate no longer waits for it.
	SigtermAfterPrestop Event = "sigterm_after_prestop"
	// NoListenerGauges says Envoy keeps no downstream_cx_active listener
	// gauges.
	NoListenerGauges Event = "no_listener_gauges"
	// TrackingLive says the live views started at the trigger.
	TrackingLive Event = "tracking_live"
	// PodCgroup names the pod's cgroup found under --cgroup-root.
	PodCgroup Event = "pod_cgroup"
	// TCPTracking says which sockets' changes run the TCP programs once
	// attached ("scope": pod-cgroup or node, and why node).
	TCPTracking Event = "tcp_tracking"
	// AppTracking says how the app's processes are followed once started
	// ("via": cgroup-events, sched-tracepoints or proc-polling, and why).
	AppTracking Event = "app_tracking"
	// TrackingFailed says the live views did not start.
	TrackingFailed Event = "tracking_failed"
	// GateDeadlineLate says the gate deadline came before a native
	// sidecar's SIGTERM (its app still runs); the gate holds on to the late
	// gate deadline (fields after, late_gate_deadline; app_processes and
	// app_processes_complete with a process view).
	GateDeadlineLate Event = "gate_deadline_late"
	// DrainListenersSent says POST /drain_listeners succeeded.
	DrainListenersSent Event = "drain_listeners_sent"
	// DrainListenersFailed says an attempt failed (logged once per error).
	DrainListenersFailed Event = "drain_listeners_failed"
	// DrainListenersGaveUp says the drain ended before drain_listeners
	// succeeded.
	DrainListenersGaveUp Event = "drain_listeners_gave_up"
	// AppBack says the app came back within the restart grace.
	AppBack Event = "app_back"
	// AppGone says that, under --exit-with-app, the app's processes are
	// gone; the proxy stops after the restart grace unless it comes back
	// (fields main_exit, app, grace).
	AppGone Event = "app_gone"
	// AppFailedKept says that, under --exit-with-app success, the app's
	// main process failed; the proxy stays for its restart (field
	// main_exit).
	AppFailedKept Event = "app_failed_kept"
	// AppSeen says that, under --exit-with-app, the first app process is
	// seen.
	AppSeen Event = "app_seen"
	// AppNotSeenYet says that, under --exit-with-app, no app process has
	// been seen since draind began watching: it waits for one, at most
	// --app-start-timeout.
	AppNotSeenYet Event = "app_not_seen_yet"
	// AppNeverSeen says --app-start-timeout passed without an app process:
	// the app is taken as done before draind watched (exit code unknown).
	AppNeverSeen Event = "app_never_seen"
	// DeadlineReached says the drain (or prestop) deadline passed with
	// flows still open.
	DeadlineReached Event = "deadline_reached"
	// OpenFlowAtDeadline names one flow still open at the deadline.
	OpenFlowAtDeadline Event = "open_flow_at_deadline"
)

// The agent's events (package agent) and the flow tracker's (package flows).
const (
	// ProxyStarted says the proxy's process started.
	ProxyStarted Event = "proxy_started"
	// EarlyExits says, under --exit-with-app, whether the recorder of the
	// pod's other containers' exits runs from draind's start (pod, or why
	// not).
	EarlyExits Event = "early_exits"
	// SignalReceived says draind received a signal (field signal).
	SignalReceived Event = "signal"
	// Tracker says how sockets are followed (field mode).
	Tracker Event = "tracker"
	// AppLiveness says what tells the app is alive (field source).
	AppLiveness Event = "app_liveness"
	// PodShape names the pod shape draind runs in.
	PodShape Event = "pod_shape"
	// NetworkNamespace names the pod's network namespace.
	NetworkNamespace Event = "network_namespace"
	// OwnContainer names processes of draind's own container, never the
	// app.
	OwnContainer Event = "own_container"
	// ProxyIsPilotAgent says the proxy is Istio's pilot-agent.
	ProxyIsPilotAgent Event = "proxy_is_pilot_agent"
	// DeadlineDecided names the drain deadline and what decided it.
	DeadlineDecided Event = "deadline_decided"
	// GraceWarning says the drain deadline does not fit the default grace
	// period (field detail).
	GraceWarning Event = "grace_warning"
	// DeadlinesReconciled says the deadlines given did not fit together and
	// were changed (field detail).
	DeadlinesReconciled Event = "deadlines_reconciled"
	// IstioSetting says an Istio setting draind reads is deprecated or
	// ignored (field detail).
	IstioSetting Event = "istio_setting"
	// Capabilities lists draind's capabilities at a stage (field stage).
	Capabilities Event = "capabilities"
	// CapabilityMissing says draind lacks a capability it would use after
	// start-up (field cap).
	CapabilityMissing Event = "capability_missing"
	// ReadinessFromReady says readiness comes from Envoy's GET /ready.
	ReadinessFromReady Event = "readiness_from_ready"
	// NoInboundListener says no Envoy listener is INBOUND: every listener
	// drains.
	NoInboundListener Event = "no_inbound_listener"
	// ListenersUnmatched lists --exclude-listeners names that match no
	// listener of Envoy's; kept as stat names (field unmatched).
	ListenersUnmatched Event = "listeners_unmatched"
	// ListenersUnread says Envoy's listeners could not be read; listener
	// names match stat names only.
	ListenersUnread Event = "listeners_unread"
	// ArrivalsUncounted marks --min-drain auto without an arrival counter
	// (Envoy's or the kernel's): only the poll sees arrivals.
	ArrivalsUncounted Event = "arrivals_uncounted"
	// ExitOnZeroSubsumed says Istio's EXIT_ON_ZERO_ACTIVE_CONNECTIONS is
	// set; draind's drain does what it asks and more.
	ExitOnZeroSubsumed Event = "exit_on_zero_subsumed"
	// LiveViewStopped says a view live during the drain stopped with an
	// error (field part).
	LiveViewStopped Event = "live_view_stopped"
	// ListenersExcluded lists Envoy listeners excluded from the drain by
	// name.
	ListenersExcluded Event = "listeners_excluded"
	// Resynced says the flow tracker resynced after lost events.
	Resynced Event = "resynced"
	// KubeletLags says a native sidecar's late gate deadline came before
	// its SIGTERM; it holds KubeletLagAllowance more for its app (fields
	// after, allowance).
	KubeletLags Event = "kubelet_lags"
	// GraceSpent says a native sidecar's SIGTERM came with an app process
	// still running: the kubelet's grace period is spent, and the gate
	// holds for the app GraceSpentHold at most (fields app_processes,
	// since_drain, hold).
	GraceSpent Event = "grace_spent"
	// QuitFailed says the proxy did not take quitquitquit: draind signals
	// it at once (field error).
	QuitFailed Event = "quit_failed"
	// ProxySignalled says the proxy outlived a stop step: draind signals
	// it (field signal), or failed to (field error too).
	ProxySignalled Event = "proxy_signalled"
	// FlowsRefreshFailed says a re-read of the flows' idle times failed;
	// the next wake tries again (field error).
	FlowsRefreshFailed Event = "flows_refresh_failed"
	// TrackerStopped says the flow tracker stopped before the drain's end:
	// the app's flows can no longer be seen (field error).
	TrackerStopped Event = "tracker_stopped"
	// CapabilitiesFailed says a change to draind's capabilities failed
	// (fields error, action: raise, limit, drop).
	CapabilitiesFailed Event = "capabilities_failed"
	// CleanupFailed says closing a part at exit failed (field error).
	CleanupFailed Event = "cleanup_failed"
	// StatusServerFailed says the status server stopped serving (field
	// error).
	StatusServerFailed Event = "status_server_failed"
	// ResyncFailed says the resync after lost events failed; the next loss
	// or snapshot tries again (fields lost, error).
	ResyncFailed Event = "resync_failed"
	// TrackerPolls says the eBPF probe failed to attach or failed after
	// load; the tracker polls sock_diag instead (field error).
	TrackerPolls Event = "tracker_polls"
)

// The pod's Kubernetes Events (package kubeevents, wired by agent).
const (
	// KubeEvents says, at start, whether draind posts Events on its pod
	// (fields enabled, pod, namespace, uid, node, or why not).
	KubeEvents Event = "kube_events"
	// KubeEventsUnavailable says once that the pod cannot post Events
	// (field why: no-api-server, no-service-account-token,
	// service-account-files, denied, unreachable).
	KubeEventsUnavailable Event = "kube_events_unavailable"
	// KubeEventPostFailed says one Event was not posted (refused, timed
	// out, or dropped with the queue full; field reason: the Event's).
	KubeEventPostFailed Event = "kube_event_post_failed"
)
