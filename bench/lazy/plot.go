//go:build linux

package main

import (
	"fmt"
	"image/color"

	"github.com/dsecproject/dsec/bench/internal/cdfplot"
)

var colorOf = map[string]color.RGBA{
	modeLazy:  {31, 119, 180, 255},
	modeEager: {214, 39, 40, 255},
}

// writePlot draws the per-task completion times of r's modes as
// cumulative distributions on a log time axis into a PNG file.
func writePlot(path string, r *Report) error {
	p := cdfplot.Panel{Title: "task done (create + reads): share of tasks done within x ms"}
	for _, m := range r.Modes {
		if len(m.Task.Samples) > 0 {
			p.Series = append(p.Series, cdfplot.Series{Name: m.Name, Color: colorOf[m.Name], Samples: m.Task.Samples})
		}
	}
	if len(p.Series) == 0 {
		return fmt.Errorf("no samples to plot")
	}
	return cdfplot.WritePNG(path, []cdfplot.Panel{p})
}
