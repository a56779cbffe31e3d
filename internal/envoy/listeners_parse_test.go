package envoy

import (
	"errors"
	"fmt"
	"testing"
)

// The config dump's listener entries as Envoy writes them: static ones,
// dynamic ones (active or only warming), the whole ListenersConfigDump of
// a plain /config_dump, an unnamed listener and an UNSPECIFIED direction.
func TestParseListenerConfigs(t *testing.T) {
	const dump = `{"configs": [
 {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump.DynamicListener",
  "name": "virtualInbound",
  "active_state": {"version_info": "2026-11-24T20:00:00Z/9",
   "listener": {"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": "virtualInbound",
    "address": {"socket_address": {"address": "0.0.0.0", "port_value": 15006}},
    "traffic_direction": "INBOUND"},
   "last_updated": "2026-11-24T20:00:01.000Z"}},
 {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump.DynamicListener",
  "name": "warming",
  "warming_state": {"listener": {"name": "warming", "address": {"socket_address": {"address": "::", "port_value": 8443}},
   "traffic_direction": "UNSPECIFIED"}}},
 {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
  "static_listeners": [{"listener": {"address": {"socket_address": {"address": "0.0.0.0", "port_value": 15090}},
   "stat_prefix": "prometheus_stats"}, "last_updated": "2026-11-24T20:00:00.000Z"}]},
 {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump", "bootstrap": {}}
]}`
	got, err := parseListenerConfigs([]byte(dump))
	if err != nil {
		t.Fatal(err)
	}
	want := "[{virtualInbound  INBOUND 0.0.0.0:15006} {warming   [::]:8443} { prometheus_stats  0.0.0.0:15090}]"
	if fmt.Sprint(got) != want {
		t.Errorf("got %v\nwant %s", got, want)
	}
	for _, bad := range []string{"", "<html>", `{"configs": 3}`} {
		if _, err := parseListenerConfigs([]byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", bad, err)
		}
	}
	ls, err := parseListenerStatuses([]byte(`{"listener_statuses": [{"name": "a", "local_address": {"socket_address": {"address": "127.0.0.1", "port_value": 40123}}},
		{"name": "pipe", "local_address": {"pipe": {"path": "/tmp/x"}}}]}`))
	if err != nil || fmt.Sprint(ls) != "[{a 40123} {pipe 0}]" {
		t.Errorf("statuses %v %v", ls, err)
	}
}
