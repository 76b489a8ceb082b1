package cdfplot

import (
	"strings"
	"testing"
)

func TestGlyphs(t *testing.T) {
	for r, g := range glyphs {
		for i, line := range g {
			if len(line) != 5 || strings.Trim(line, "# ") != "" {
				t.Errorf("glyph %q row %d = %q, want 5 of '#' or ' '", r, i, line)
			}
		}
	}
	if glyphFor('D') != glyphs['d'] || glyphFor('→') != glyphs['>'] || glyphFor('€') != glyphs['?'] {
		t.Errorf("glyphFor maps capitals, arrows or unknowns wrongly")
	}
}
