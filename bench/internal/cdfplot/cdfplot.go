// Package cdfplot draws latency samples as step CDFs on a log time axis,
// one panel per figure, into a PNG: the plots of the benchmarks. It is
// drawn by hand with image/png (gonum.org/v1/plot is not in the module
// graph, and a CDF needs little), with a built-in 5×7 bitmap font.
package cdfplot

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"
)

var (
	ink  = color.RGBA{30, 30, 30, 255}
	grid = color.RGBA{225, 225, 225, 255}
)

// Series is one curve: its legend name, colour and samples (sorted
// ascending, in ms; at least one).
type Series struct {
	Name    string
	Color   color.RGBA
	Samples []float64
}

// Panel is one figure: a title and its curves.
type Panel struct {
	Title  string
	Series []Series
}

// Width is the image's width and PanelHeight each panel's height, in pixels.
const (
	Width       = 1400
	PanelHeight = 440
)

const (
	marginLeft  = 90
	marginRight = 430 // the legend
	marginTop   = 50
	marginBot   = 60
	textScale   = 2
)

// WritePNG renders the panels into a PNG file at path.
func WritePNG(path string, panels []Panel) error {
	img := Render(panels)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Render draws the panels one above the other.
func Render(panels []Panel) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, Width, PanelHeight*len(panels)))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	for i, p := range panels {
		drawPanel(img, image.Rect(0, i*PanelHeight, Width, (i+1)*PanelHeight), p)
	}
	return img
}

func drawPanel(img *image.RGBA, r image.Rectangle, p Panel) {
	area := image.Rect(r.Min.X+marginLeft, r.Min.Y+marginTop, r.Max.X-marginRight, r.Max.Y-marginBot)
	drawText(img, area.Min.X, r.Min.Y+14, p.Title, ink, textScale)

	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		lo, hi = math.Min(lo, s.Samples[0]), math.Max(hi, s.Samples[len(s.Samples)-1])
	}
	lo = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 0.01))))
	hi = math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*10))))
	xOf := func(ms float64) int {
		f := (math.Log10(math.Max(ms, lo)) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		return area.Min.X + int(math.Round(f*float64(area.Dx())))
	}
	yOf := func(frac float64) int { return area.Max.Y - int(math.Round(frac*float64(area.Dy()))) }

	// Grid and ticks: 1, 2, 5 × 10^k on x; quarters on y.
	for dec := lo; dec < hi*1.001; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := dec * m
			if v > hi*1.001 {
				break
			}
			x := xOf(v)
			vline(img, x, area.Min.Y, area.Max.Y, grid)
			label := strconv.FormatFloat(v, 'g', -1, 64)
			drawText(img, x-textWidth(label, textScale)/2, area.Max.Y+8, label, ink, textScale)
		}
	}
	for q := 0; q <= 4; q++ {
		y := yOf(float64(q) / 4)
		hline(img, area.Min.X, area.Max.X, y, grid)
		label := fmt.Sprintf("%d%%", q*25)
		drawText(img, area.Min.X-10-textWidth(label, textScale), y-7, label, ink, textScale)
	}
	drawText(img, area.Min.X+area.Dx()/2-textWidth("ms (log scale)", textScale)/2, area.Max.Y+32, "ms (log scale)", ink, textScale)
	hline(img, area.Min.X, area.Max.X, area.Max.Y, ink)
	vline(img, area.Min.X, area.Min.Y, area.Max.Y, ink)

	// Step CDFs.
	for _, s := range p.Series {
		c := s.Color
		n := float64(len(s.Samples))
		px, py := xOf(s.Samples[0]), yOf(0)
		for i, v := range s.Samples {
			x, y := xOf(v), yOf(float64(i+1)/n)
			thickLine(img, px, py, x, py, c)
			thickLine(img, x, py, x, y, c)
			px, py = x, y
		}
	}

	// Legend: colour, name, p50.
	lx, ly := area.Max.X+24, area.Min.Y
	for _, s := range p.Series {
		c := s.Color
		draw.Draw(img, image.Rect(lx, ly+2, lx+24, ly+12), image.NewUniform(c), image.Point{}, draw.Src)
		drawText(img, lx+32, ly, s.Name, ink, textScale)
		p50 := s.Samples[int(math.Ceil(0.5*float64(len(s.Samples))))-1]
		drawText(img, lx+32, ly+18, fmt.Sprintf("p50 %.1f ms, n %d", p50, len(s.Samples)), c, textScale)
		ly += 46
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

// thickLine draws a horizontal or vertical segment two pixels wide.
func thickLine(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	if x0 > x1 {
		x0, x1 = x1, x0
	}
	if y0 > y1 {
		y0, y1 = y1, y0
	}
	draw.Draw(img, image.Rect(x0, y0, x1+2, y1+2), image.NewUniform(c), image.Point{}, draw.Src)
}
