// Package e2e holds draind's whole-binary tests: real pods built from
// namespaces the tests create, with draind, envoysim (the Envoy stand-in)
// and an app as real processes, real traffic and real signals. They need
// root; without it they skip. See docs/design.md ("Tests").
package e2e
