//go:build linux

package main

import (
	"fmt"
	"image/color"

	"github.com/dsecproject/dsec/bench/internal/cdfplot"
)

var colorOf = map[string]color.RGBA{
	"dsec":   {31, 119, 180, 255},
	"crun":   {44, 160, 44, 255},
	"runc":   {255, 127, 14, 255},
	"docker": {214, 39, 40, 255},
}

// writePlot draws the latency figures of r as cumulative distributions on
// a log time axis, one panel each, into a PNG file.
func writePlot(path string, r *Result) error {
	var panels []cdfplot.Panel
	for _, f := range []struct {
		title string
		rows  []LatencyRow
	}{
		{"1. create -> first exec done: share of runs done within x ms", r.CreateFirstExec},
		{"2. exec round trip of true: share of runs done within x ms", r.ExecRTT},
	} {
		p := cdfplot.Panel{Title: f.title}
		for _, row := range f.rows {
			if len(row.Samples) > 0 {
				p.Series = append(p.Series, cdfplot.Series{Name: row.Name, Color: colorOf[row.System], Samples: row.Samples})
			}
		}
		if len(p.Series) > 0 {
			panels = append(panels, p)
		}
	}
	if len(panels) == 0 {
		return fmt.Errorf("no samples to plot")
	}
	return cdfplot.WritePNG(path, panels)
}
