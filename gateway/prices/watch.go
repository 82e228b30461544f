package prices

import (
	"log/slog"
	"time"

	"github.com/loops-dev/loops/internal/filewatch"
)

// Watcher holds the price sheet in force, loaded from a file and reloaded when the file
// changes (filewatch: a changed sheet that does not parse is logged and the one in force
// kept). A nil Watcher has no sheet.
type Watcher = filewatch.Watcher[Sheet]

// Load reads and parses the sheet in file: an error names the line or field, and a server
// refuses to start on it.
func Load(file string, log *slog.Logger) (*Watcher, error) {
	return filewatch.Load(file, filewatch.Options[Sheet]{Flag: "--prices", What: "price sheet", MaxBytes: MaxFileBytes,
		Parse:   func(data []byte) (*Sheet, error) { return Parse(data, time.Now()) },
		Version: (*Sheet).Version}, log)
}
