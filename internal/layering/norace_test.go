//go:build !race

package layering

// raceEnabled says this test binary was built with -race.
const raceEnabled = false
