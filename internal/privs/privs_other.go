//go:build !linux

package privs

import "errors"

// ErrUnsupportedOS is returned by everything here outside Linux.
var ErrUnsupportedOS = errors.New("capabilities are Linux's")

// ErrCgo is Linux's; it is never returned here.
var ErrCgo = errors.New("capabilities can only be changed on every thread of a binary built with CGO_ENABLED=0")

func Supported() error                                { return ErrUnsupportedOS }
func Current() (Sets, error)                          { return Sets{}, ErrUnsupportedOS }
func RaiseEffective() (before, after Sets, err error) { return Sets{}, Sets{}, ErrUnsupportedOS }
func LimitInherited(give Set) (Sets, error)           { return Sets{}, ErrUnsupportedOS }
func Drop(keep Set) (Sets, error)                     { return Sets{}, ErrUnsupportedOS }
func TryLoadBPF() error                               { return ErrUnsupportedOS }
func TrySetns() error                                 { return ErrUnsupportedOS }
func Threads(pid int) (map[int]Sets, error)           { return nil, ErrUnsupportedOS }
