package envoy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Listener is one of Envoy's listeners as its admin API describes it: its
// configuration (GET /config_dump, static and dynamic listeners) and the
// address it is bound to (GET /listeners?format=json).
type Listener struct {
	// Name is the listener's name (Envoy makes one up when the config has
	// none).
	Name string
	// Address is the configured address; its port may be 0.
	Address netip.AddrPort
	// Port is the bound port (a configured port 0 resolved); 0 when
	// /listeners did not list the listener.
	Port uint16
	// StatPrefix is the listener's own stat_prefix ("" when unset).
	StatPrefix string
	// Direction is traffic_direction: "INBOUND", "OUTBOUND" or ""
	// (UNSPECIFIED, which proto3 JSON leaves out).
	Direction string
}

// StatScope is the name the listener has in listener.<name>. stats: its
// stat_prefix, else its configured address with ':' as '_'
// (source/common/listener_manager/listener_impl.cc names the scope after the
// configured address, so a port-0 listener is "127.0.0.1_0").
func (l Listener) StatScope() string {
	if l.StatPrefix != "" {
		return l.StatPrefix
	}
	if !l.Address.IsValid() {
		return ""
	}
	return strings.ReplaceAll(l.Address.String(), ":", "_")
}

// Inbound reports whether /drain_listeners?inboundonly drains the listener.
func (l Listener) Inbound() bool { return l.Direction == "INBOUND" }

// Listeners asks Envoy for its listeners: GET /listeners?format=json for
// the names and bound addresses, and GET /config_dump?resource= for the
// static and the dynamic listeners' configuration (stat_prefix,
// traffic_direction). Three small answers, made once (at LIVE): draind
// never reads the whole config dump. Listeners are sorted by name.
func (c *Client) Listeners(ctx context.Context) ([]Listener, error) {
	_, body, err := c.do(ctx, request{method: "GET", path: "/listeners", query: "format=json", repeatable: true})
	if err != nil {
		return nil, err
	}
	bound, err := parseListenerStatuses(body)
	if err != nil {
		return nil, err
	}
	byName := map[string]*Listener{}
	var out []*Listener
	get := func(name string) *Listener {
		if l, ok := byName[name]; ok {
			return l
		}
		l := &Listener{Name: name}
		byName[name] = l
		out = append(out, l)
		return l
	}
	for _, b := range bound {
		get(b.name).Port = b.port
	}
	for _, res := range []string{"static_listeners", "dynamic_listeners"} {
		_, body, err := c.do(ctx, request{method: "GET", path: "/config_dump", query: "resource=" + res, repeatable: true})
		if err != nil {
			return nil, err
		}
		cfgs, err := parseListenerConfigs(body)
		if err != nil {
			return nil, err
		}
		for _, lc := range cfgs {
			l := get(lc.Name)
			l.Address, l.StatPrefix, l.Direction = lc.Address, lc.StatPrefix, lc.Direction
			if l.Port == 0 {
				l.Port = lc.Address.Port()
			}
		}
	}
	res := make([]Listener, 0, len(out))
	for _, l := range out {
		res = append(res, *l)
	}
	sort.Slice(res, func(i, j int) bool { return res[i].Name < res[j].Name })
	return res, nil
}

type boundListener struct {
	name string
	port uint16
}

// jsonAddress is envoy.config.core.v3.Address in proto3 JSON.
type jsonAddress struct {
	SocketAddress *struct {
		Address   string `json:"address"`
		PortValue uint16 `json:"port_value"`
	} `json:"socket_address"`
}

func (a jsonAddress) addrPort() netip.AddrPort {
	if a.SocketAddress == nil {
		return netip.AddrPort{} // a pipe or an internal listener
	}
	ip, err := netip.ParseAddr(a.SocketAddress.Address)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ip, a.SocketAddress.PortValue)
}

// parseListenerStatuses reads GET /listeners?format=json
// (envoy.admin.v3.Listeners: listener_statuses with name and
// local_address, source/server/admin/listeners_handler.cc).
func parseListenerStatuses(b []byte) ([]boundListener, error) {
	var v struct {
		Statuses []struct {
			Name         string      `json:"name"`
			LocalAddress jsonAddress `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, malformed("GET /listeners?format=json: %v", err)
	}
	var out []boundListener
	for _, s := range v.Statuses {
		out = append(out, boundListener{name: s.Name, port: s.LocalAddress.addrPort().Port()})
	}
	return out, nil
}

// listenerConfig is a listener's configuration as read from the config dump.
type listenerConfig struct {
	Name, StatPrefix, Direction string
	Address                     netip.AddrPort
}

// jsonListener is the part of envoy.config.listener.v3.Listener draind reads.
type jsonListener struct {
	Name             string      `json:"name"`
	Address          jsonAddress `json:"address"`
	StatPrefix       string      `json:"stat_prefix"`
	TrafficDirection string      `json:"traffic_direction"`
}

// parseListenerConfigs reads GET /config_dump?resource=static_listeners or
// dynamic_listeners: {"configs":[...]} of
// ListenersConfigDump.StaticListener ({"listener":{...}}) or
// DynamicListener ({"name":..,"active_state":{"listener":{...}}}, else its
// warming_state). A whole ListenersConfigDump (an answer to a plain
// /config_dump) is read too. Other entries are skipped.
func parseListenerConfigs(b []byte) ([]listenerConfig, error) {
	type state struct {
		Listener *jsonListener `json:"listener"`
	}
	type entry struct {
		Listener     *jsonListener `json:"listener"`
		Name         string        `json:"name"`
		ActiveState  *state        `json:"active_state"`
		WarmingState *state        `json:"warming_state"`
		Static       []entry       `json:"static_listeners"`
		Dynamic      []entry       `json:"dynamic_listeners"`
	}
	var v struct {
		Configs []entry `json:"configs"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, malformed("GET /config_dump: %v", err)
	}
	var out []listenerConfig
	var add func(e entry)
	add = func(e entry) {
		for _, s := range slices.Concat(e.Static, e.Dynamic) {
			add(s)
		}
		l := e.Listener
		switch {
		case l != nil:
		case e.ActiveState != nil && e.ActiveState.Listener != nil:
			l = e.ActiveState.Listener
		case e.WarmingState != nil && e.WarmingState.Listener != nil:
			l = e.WarmingState.Listener
		default:
			return
		}
		name := l.Name
		if name == "" {
			name = e.Name
		}
		dir := l.TrafficDirection
		if dir == "UNSPECIFIED" {
			dir = ""
		}
		out = append(out, listenerConfig{Name: name, StatPrefix: l.StatPrefix, Direction: dir, Address: l.Address.addrPort()})
	}
	for _, e := range v.Configs {
		add(e)
	}
	return out, nil
}

// Resolve maps the names in e.Names to Envoy's listeners: a name that is a
// listener's name or its stat scope adds that listener's bound port to
// Ports (so that the kernel's view can leave its sockets out too) and its
// stat scope to Names (so that a listener named by a stat_prefix, or by
// its configured port-0 address, leaves the admin sum). Names that match no
// listener are kept as they are (a stat scope Envoy may create later) and
// returned as unmatched.
func (e ExcludeSet) Resolve(ls []Listener) (resolved ExcludeSet, unmatched []string) {
	resolved = ExcludeSet{Ports: slices.Clone(e.Ports), Names: slices.Clone(e.Names)}
	for _, n := range e.Names {
		found := false
		for _, l := range ls {
			if l.Name != n && l.StatScope() != n {
				continue
			}
			found = true
			if l.Port != 0 && !slices.Contains(resolved.Ports, l.Port) {
				resolved.Ports = append(resolved.Ports, l.Port)
			}
			if s := l.StatScope(); s != "" && !slices.Contains(resolved.Names, s) {
				resolved.Names = append(resolved.Names, s)
			}
		}
		if !found {
			unmatched = append(unmatched, n)
		}
	}
	return resolved, unmatched
}

// String is the set as flags would give it: "ports 15020,15021 names metrics".
func (e ExcludeSet) String() string {
	ports := make([]string, len(e.Ports))
	for i, p := range e.Ports {
		ports[i] = fmt.Sprint(p)
	}
	return fmt.Sprintf("ports [%s] names [%s]", strings.Join(ports, ","), strings.Join(e.Names, ","))
}
