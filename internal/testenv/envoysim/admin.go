package envoysim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// adminEndpoint is one admin API path. Matching is on the exact path; the
// query string plays no part, as in Envoy.
type adminEndpoint struct {
	path   string
	help   string
	post   bool // mutates the server: POST only
	params []string
	h      func(*Sim, http.ResponseWriter, *http.Request)
}

// adminEndpoints are listed as Envoy's help lists them, by path. They are
// set in init: the help handler lists them.
var adminEndpoints []adminEndpoint

func init() {
	adminEndpoints = []adminEndpoint{
		{path: "/", help: "Admin home page", h: (*Sim).handleHelp},
		{path: "/config_dump", help: "dump current Envoy configs (experimental)", params: []string{
			"resource: The resource to dump",
			"mask: The mask to apply. When both resource and mask are specified, the mask is applied to every element in the desired repeated field so that only a subset of fields are returned. The mask is parsed as a ProtobufWkt::FieldMask",
			"name_regex: Dump only the currently loaded configurations whose names match the specified regex. Can be used with both resource and mask query parameters.",
			"include_eds: Dump currently loaded configuration including EDS. See the response definition for more information",
		}, h: (*Sim).handleConfigDump},
		{path: "/drain_listeners", help: "drain listeners", post: true, params: []string{
			"graceful: When draining listeners, enter a graceful drain period prior to closing listeners. This behaviour and duration is configurable via server options or CLI",
			"skip_exit: When draining listeners, do not exit after the drain period. This must be used with graceful",
			"inboundonly: Drains all inbound listeners. traffic_direction field in envoy_v3_api_msg_config.listener.v3.Listener is used to determine whether a listener is inbound or outbound.",
		}, h: (*Sim).handleDrainListeners},
		{path: "/envoysim/fault", help: "envoysim test hook: set the fault in force (admin=hang|500|garbage|slow, admin_delay=D, crash_after=D, crash_after_drain=D, crash_exit_code=N, exit_at_start=N, never_live=true)", post: true, h: (*Sim).handleFault},
		{path: "/healthcheck/fail", help: "cause the server to fail health checks", post: true, h: healthcheckHandler(true)},
		{path: "/healthcheck/ok", help: "cause the server to pass health checks", post: true, h: healthcheckHandler(false)},
		{path: "/help", help: "print out list of admin commands", h: (*Sim).handleHelp},
		{path: "/listeners", help: "print listener info", params: []string{"format: File format to use"}, h: (*Sim).handleListeners},
		{path: "/quitquitquit", help: "exit the server", post: true, h: (*Sim).handleQuit},
		{path: "/ready", help: "print server state, return 200 if LIVE, otherwise return 503", h: (*Sim).handleReady},
		{path: "/reset_counters", help: "reset all counters to zero", post: true, h: (*Sim).handleResetCounters},
		{path: "/server_info", help: "print server version/status information", h: (*Sim).handleServerInfo},
		{path: "/stats", help: "print server stats", params: []string{
			"usedonly: Only include stats that have been written by system since restart",
			"filter: Regular expression (Google re2) for filtering stats",
			"format: Format to use",
			"type: Stat types to include.",
		}, h: (*Sim).handleStats},
		{path: "/stats/prometheus", help: "print server stats in prometheus format", h: (*Sim).handlePrometheus},
	}
}

func helpText() string {
	var b strings.Builder
	b.WriteString("admin commands are:\n")
	for _, e := range adminEndpoints {
		post := ""
		if e.post {
			post = " (POST)"
		}
		fmt.Fprintf(&b, "  %s%s: %s\n", e.path, post, e.help)
		for _, p := range e.params {
			fmt.Fprintf(&b, "      %s\n", p)
		}
	}
	return b.String()
}

// garbage is the body of the garbage fault: neither stats text, nor JSON,
// nor a state name.
const garbage = "\x00\x1f\x8b<html><body>502 Bad Gateway</body></html>\n{\"stats\":[{\"name\":\n"

const textPlain = "text/plain; charset=UTF-8"

func (s *Sim) reply(w http.ResponseWriter, code int, ctype, body string) {
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Cache-Control", "no-cache, max-age=0")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Server", "envoy")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	io.WriteString(w, body)
	switch code / 100 {
	case 2:
		s.admin.rq2xx.inc()
	case 4:
		s.admin.rq4xx.inc()
	case 5:
		s.admin.rq5xx.inc()
	}
}

func (s *Sim) serveAdmin(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		panic(http.ErrAbortHandler) // stopping: drop the connection, no answer
	}
	defer s.leave()
	if s.cfg.LogAdminRequests {
		s.logf("admin %s %s", r.Method, r.URL.RequestURI())
	}
	s.admin.rqTotal.inc()
	s.admin.rqActive.inc()
	defer s.admin.rqActive.dec()

	if r.URL.Path != "/envoysim/fault" {
		f := s.currentFault()
		if d := f.adminDelay(); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			case <-s.ctx.Done():
				t.Stop()
				panic(http.ErrAbortHandler)
			}
		}
		switch f.Admin {
		case AdminHang:
			s.hang(w, r)
			return
		case AdminError:
			s.reply(w, http.StatusInternalServerError, textPlain, "envoysim: injected fault\n")
			return
		case AdminGarbage:
			s.reply(w, http.StatusOK, textPlain, garbage)
			return
		}
	}
	for _, e := range adminEndpoints {
		if e.path != r.URL.Path {
			continue
		}
		if e.post && r.Method != http.MethodPost {
			s.reply(w, http.StatusMethodNotAllowed, textPlain, fmt.Sprintf("Method %s not allowed, POST required.", r.Method))
			return
		}
		e.h(s, w, r)
		return
	}
	s.reply(w, http.StatusNotFound, textPlain, "invalid path. "+helpText())
}

// hang takes the connection over and never answers; it returns when the
// peer closes or the sim stops (which closes every connection).
func (s *Sim) hang(w http.ResponseWriter, r *http.Request) {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		select {
		case <-r.Context().Done():
		case <-s.ctx.Done():
		}
		return
	}
	defer c.Close()
	io.Copy(io.Discard, c)
}

func (s *Sim) handleHelp(w http.ResponseWriter, _ *http.Request) {
	s.reply(w, http.StatusOK, textPlain, helpText())
}

func (s *Sim) handleReady(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	state := s.stateLocked()
	s.mu.Unlock()
	code := http.StatusOK
	if state != stateLive {
		code = http.StatusServiceUnavailable
	}
	s.reply(w, code, textPlain, stateNames[state]+"\n")
}

func (s *Sim) handleStats(w http.ResponseWriter, r *http.Request) {
	p, bad := parseStatsParams(r.URL.Query())
	if bad != "" {
		s.reply(w, http.StatusBadRequest, textPlain, bad)
		return
	}
	s.statsRead()
	samples, hs := s.st.snapshot(p)
	switch p.format {
	case "html", "active-html":
		s.reply(w, http.StatusOK, "text/html; charset=UTF-8", string(renderHTML(samples, hs)))
	case "json":
		s.reply(w, http.StatusOK, "application/json", string(renderJSON(samples, hs)))
	case "prometheus":
		s.reply(w, http.StatusOK, "text/plain; version=0.0.4", string(renderPrometheus(samples)))
	default:
		s.reply(w, http.StatusOK, textPlain, string(renderText(samples, hs)))
	}
}

func (s *Sim) handlePrometheus(w http.ResponseWriter, r *http.Request) {
	s.statsRead()
	samples, _ := s.st.snapshot(statsParams{typ: "All"})
	s.reply(w, http.StatusOK, "text/plain; version=0.0.4", string(renderPrometheus(samples)))
}

func (s *Sim) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	type options struct {
		BaseID             string   `json:"base_id"`
		Concurrency        int      `json:"concurrency"`
		ConfigPath         string   `json:"config_path"`
		AdminAddressPath   string   `json:"admin_address_path"`
		LocalAddressIPVer  string   `json:"local_address_ip_version"`
		LogLevel           string   `json:"log_level"`
		DrainStrategy      string   `json:"drain_strategy"`
		Mode               string   `json:"mode"`
		DisableHotRestart  bool     `json:"disable_hot_restart"`
		RestartEpoch       int      `json:"restart_epoch"`
		DisabledExtensions []string `json:"disabled_extensions"`
		FileFlushInterval  string   `json:"file_flush_interval"`
		DrainTime          string   `json:"drain_time"`
		ParentShutdownTime string   `json:"parent_shutdown_time"`
	}
	type info struct {
		Version           string   `json:"version"`
		State             string   `json:"state"`
		HotRestartVersion string   `json:"hot_restart_version"`
		Options           options  `json:"command_line_options"`
		Node              struct{} `json:"node"`
		UptimeCurrent     string   `json:"uptime_current_epoch"`
		UptimeAll         string   `json:"uptime_all_epochs"`
	}
	strategy := "Gradual"
	if s.cfg.DrainStrategy == "immediate" {
		strategy = "Immediate"
	}
	up := formatDuration(time.Since(s.start).Truncate(time.Second))
	v := info{
		Version:           "0000000000000000000000000000000000000000/1.36.0-envoysim/Clean/RELEASE/BoringSSL",
		State:             s.stateName(),
		HotRestartVersion: "disabled",
		Options: options{
			BaseID:             "0",
			Concurrency:        s.cfg.Concurrency,
			ConfigPath:         s.cfg.ConfigPath,
			AdminAddressPath:   s.cfg.AdminAddressPath,
			LocalAddressIPVer:  "v4",
			LogLevel:           "info",
			DrainStrategy:      strategy,
			Mode:               "Serve",
			DisableHotRestart:  true,
			DisabledExtensions: []string{},
			FileFlushInterval:  "10s",
			DrainTime:          formatDuration(s.cfg.DrainTime),
			ParentShutdownTime: formatDuration(s.cfg.ParentShutdownTime),
		},
		UptimeCurrent: up,
		UptimeAll:     up,
	}
	b, _ := json.MarshalIndent(v, "", " ")
	s.reply(w, http.StatusOK, "application/json", string(b)+"\n")
}

func (s *Sim) handleListeners(w http.ResponseWriter, r *http.Request) {
	if f := r.URL.Query()["format"]; len(f) > 0 && f[0] == "json" {
		type sockAddr struct {
			Address   string `json:"address"`
			PortValue uint16 `json:"port_value"`
		}
		type status struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress sockAddr `json:"socket_address"`
			} `json:"local_address"`
		}
		out := struct {
			Statuses []status `json:"listener_statuses"`
		}{Statuses: []status{}}
		for _, l := range s.listeners {
			var st status
			st.Name = l.cfg.Name
			ap := netip.MustParseAddrPort(l.addr.String())
			st.LocalAddress.SocketAddress = sockAddr{ap.Addr().String(), ap.Port()}
			out.Statuses = append(out.Statuses, st)
		}
		b, _ := json.MarshalIndent(out, "", " ")
		s.reply(w, http.StatusOK, "application/json", string(b)+"\n")
		return
	}
	var b strings.Builder
	for _, l := range s.listeners {
		fmt.Fprintf(&b, "%s::%s\n", l.cfg.Name, l.addr)
	}
	s.reply(w, http.StatusOK, textPlain, b.String())
}

// handleConfigDump serves the listeners' part of GET /config_dump (the sim
// has no other configuration): its listeners are static. With
// resource=static_listeners or dynamic_listeners, the entries of that
// field, each with its @type; without, one ListenersConfigDump.
func (s *Sim) handleConfigDump(w http.ResponseWriter, r *http.Request) {
	type sockAddr struct {
		Address   string `json:"address"`
		PortValue uint16 `json:"port_value"`
	}
	type listenerJSON struct {
		Type    string `json:"@type"`
		Name    string `json:"name"`
		Address struct {
			SocketAddress sockAddr `json:"socket_address"`
		} `json:"address"`
		StatPrefix       string `json:"stat_prefix,omitempty"`
		TrafficDirection string `json:"traffic_direction,omitempty"`
		DrainType        string `json:"drain_type,omitempty"`
	}
	type static struct {
		Type        string       `json:"@type,omitempty"`
		Listener    listenerJSON `json:"listener"`
		LastUpdated string       `json:"last_updated"`
	}
	updated := s.start.UTC().Format("2006-01-02T15:04:05.000Z")
	var statics []static
	for _, l := range s.listeners {
		lj := listenerJSON{Type: "type.googleapis.com/envoy.config.listener.v3.Listener", Name: l.cfg.Name, StatPrefix: l.cfg.StatPrefix}
		ap := netip.MustParseAddrPort(l.cfg.Address)
		lj.Address.SocketAddress = sockAddr{ap.Addr().String(), ap.Port()}
		switch l.cfg.Direction { // UNSPECIFIED is proto3's default: left out
		case "inbound":
			lj.TrafficDirection = "INBOUND"
		case "outbound":
			lj.TrafficDirection = "OUTBOUND"
		}
		if l.cfg.DrainType == "modify_only" {
			lj.DrainType = "MODIFY_ONLY"
		}
		statics = append(statics, static{Listener: lj, LastUpdated: updated})
	}
	var out any
	switch res := r.URL.Query().Get("resource"); res {
	case "static_listeners":
		cfgs := []any{}
		for _, st := range statics {
			st.Type = "type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener"
			cfgs = append(cfgs, st)
		}
		out = map[string]any{"configs": cfgs}
	case "dynamic_listeners":
		out = map[string]any{"configs": []any{}}
	case "":
		out = map[string]any{"configs": []any{map[string]any{
			"@type":            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
			"static_listeners": statics,
		}}}
	default:
		s.reply(w, http.StatusNotFound, textPlain, fmt.Sprintf("%s not found in config dump", res))
		return
	}
	b, _ := json.MarshalIndent(out, "", " ")
	s.reply(w, http.StatusOK, "application/json", string(b)+"\n")
}

func (s *Sim) handleDrainListeners(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, inboundOnly := q["inboundonly"]
	_, graceful := q["graceful"]
	_, skipExit := q["skip_exit"]
	// Since 1.40 (non_graceful_drain_notifies_connections) a drain without
	// graceful drains connections too, and skip_exit is allowed with it.
	eventGen := s.cfg.DrainGeneration != Drain139
	if skipExit && !graceful && !eventGen {
		s.reply(w, http.StatusBadRequest, textPlain, "skip_exit requires graceful\n")
		return
	}
	s.mu.Lock()
	s.drainRequestedLocked()
	switch d := s.drain; {
	case !graceful:
		if eventGen {
			if d == nil {
				s.drain = &drainState{start: time.Now(), all: !inboundOnly}
				s.afterLocked(s.cfg.DrainTime, s.drainDone)
			} else if !inboundOnly {
				d.all = true
			}
			s.notifyLocked(!inboundOnly)
		}
		if !skipExit {
			s.stopListenersLocked(inboundOnly)
		}
	case d == nil:
		s.drain = &drainState{start: time.Now(), all: !inboundOnly}
		if !skipExit {
			s.drain.stops = append(s.drain.stops, !inboundOnly)
		}
		s.notifyLocked(!inboundOnly)
		s.afterLocked(s.cfg.DrainTime, s.drainDone)
	case d.all || inboundOnly:
		// Already draining in that direction: nothing to do.
	default:
		// Draining inbound only, now asked for all: widen the drain; the
		// listener stop waits for the end of the first drain
		// (DrainManagerImpl keeps one sequence).
		d.all = true
		s.notifyLocked(true)
		if !skipExit {
			if d.done {
				s.stopListenersLocked(false)
			} else {
				d.stops = append(d.stops, true)
			}
		}
	}
	s.mu.Unlock()
	s.logf("drain listeners (inboundonly=%t graceful=%t skip_exit=%t)", inboundOnly, graceful, skipExit)
	s.reply(w, http.StatusOK, textPlain, "OK\n")
}

// notifyLocked marks the drained listeners (inbound ones, unless all) as
// notified of the drain, from now: the start of their connections' drain
// timeline. With the connection-event generation it pushes the drain to
// their connections (ListenerManagerImpl::onServerDrainStart), which
// schedule their proactive drain.
func (s *Sim) notifyLocked(all bool) {
	now := time.Now()
	for _, l := range s.listeners {
		if !all && !l.inbound || !l.drainStart.IsZero() {
			continue
		}
		l.drainStart = now
		if s.cfg.DrainGeneration != DrainConnectionEvent {
			continue
		}
		for c := range s.conns {
			if c.l == l {
				c.scheduleProactiveLocked(now)
			}
		}
	}
}

// drainDone ends the drain time: the listeners asked to stop stop.
func (s *Sim) drainDone() {
	s.mu.Lock()
	d := s.drain
	d.done = true
	for _, all := range d.stops {
		s.stopListenersLocked(!all)
	}
	d.stops = nil
	s.mu.Unlock()
	s.logf("drain time over: listeners stopped")
}

// stopListenersLocked closes the listen sockets (inbound ones only, if
// asked); connections stay open.
func (s *Sim) stopListenersLocked(inboundOnly bool) {
	for _, l := range s.listeners {
		if inboundOnly && !l.inbound {
			continue
		}
		listening := l.ln != nil && !l.stopped
		if l.stopLocked() && listening {
			s.lm.listenerStopped.inc()
			s.lm.listenersActive.dec()
		}
	}
}

func healthcheckHandler(fail bool) func(*Sim, http.ResponseWriter, *http.Request) {
	return func(s *Sim, w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		s.hcFailed = fail
		s.mu.Unlock()
		// server.live follows at once (Envoy's failHealthcheck sets it);
		// server.state only on the next refresh.
		if fail {
			s.server.live.set(0)
		} else {
			s.server.live.set(1)
		}
		s.reply(w, http.StatusOK, textPlain, "OK\n")
	}
}

func (s *Sim) handleResetCounters(w http.ResponseWriter, _ *http.Request) {
	s.st.resetCounters()
	s.reply(w, http.StatusOK, textPlain, "OK\n")
}

// handleQuit answers, then stops the sim as SIGTERM does.
func (s *Sim) handleQuit(w http.ResponseWriter, _ *http.Request) {
	s.reply(w, http.StatusOK, textPlain, "OK\n")
	http.NewResponseController(w).Flush()
	s.logf("shutting down via /quitquitquit")
	s.stop(nil)
}

// handleFault is the test hook behind SetFault, for the envoysim program.
// It takes the config's "fault" object as a JSON body,
// {"admin":"hang","crash_after_ms":3000}, or query parameters:
// ?admin=hang|500|garbage|slow|ok&admin_delay=2s&crash_after=3s&
// crash_after_drain=1s&crash_exit_code=N&exit_at_start=N&never_live=true.
// "ok" or "" clears the admin fault. Each request replaces the whole fault.
func (s *Sim) handleFault(w http.ResponseWriter, r *http.Request) {
	f, err := parseFaultRequest(r)
	if err == nil {
		err = s.SetFault(f)
	}
	if err != nil {
		s.reply(w, http.StatusBadRequest, textPlain, "fault: "+err.Error()+"\n")
		return
	}
	s.reply(w, http.StatusOK, textPlain, "OK\n")
}

func parseFaultRequest(r *http.Request) (Fault, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		return Fault{}, err
	}
	if len(bytes.TrimSpace(body)) > 0 {
		var ff fileFault
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ff); err != nil {
			return Fault{}, err
		}
		return ff.fault()
	}
	q := r.URL.Query()
	ff := fileFault{Admin: q.Get("admin"), NeverLive: q.Get("never_live") == "true"}
	for _, d := range []struct {
		key string
		dst *float64
	}{
		{"admin_delay", &ff.AdminDelayMs},
		{"crash_after", &ff.CrashAfterMs},
		{"crash_after_drain", &ff.CrashAfterDrainMs},
	} {
		if v := q.Get(d.key); v != "" {
			dur, err := time.ParseDuration(v)
			if err != nil {
				return Fault{}, fmt.Errorf("%s: %w", d.key, err)
			}
			*d.dst = float64(dur) / float64(time.Millisecond)
		}
	}
	for _, n := range []struct {
		key string
		dst **int
	}{
		{"crash_exit_code", nil},
		{"exit_at_start", &ff.ExitAtStart},
	} {
		v := q.Get(n.key)
		if v == "" {
			continue
		}
		code, err := strconv.Atoi(v)
		if err != nil {
			return Fault{}, fmt.Errorf("%s: %w", n.key, err)
		}
		if n.dst == nil {
			ff.CrashExitCode = code
		} else {
			*n.dst = &code
		}
	}
	return ff.fault()
}
