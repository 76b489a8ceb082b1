//go:build !linux

package main

import "errors"

func run([]string) error              { return errors.ErrUnsupported }
func serveMain([]string) error        { return errors.ErrUnsupported }
func readerMain(string, string) error { return errors.ErrUnsupported }
