package protocol

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"strings"
)

// KnownFailing is a list of globs of case names ("<file>/<case>/<surface>") expected to
// fail on one implementation, each with the reason. A nil *KnownFailing lists nothing.
type KnownFailing struct {
	entries []knownEntry
}

type knownEntry struct {
	glob, reason string
}

// ParseKnownFailing reads the known-failing format: one "<glob> # <reason>" a line; blank
// lines and lines that start with "#" are comments. Globs use path.Match syntax, so "*"
// does not cross "/": "bad_input/*/tinker" is every bad_input case on the Tinker surface.
// Every entry needs a reason.
func ParseKnownFailing(text string) (*KnownFailing, error) {
	k := &KnownFailing{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		glob, reason, _ := strings.Cut(line, "#")
		glob, reason = strings.TrimSpace(glob), strings.TrimSpace(reason)
		if reason == "" {
			return nil, fmt.Errorf("known-failing line %d: %q has no reason (write \"<glob> # <why it fails>\")", n, glob)
		}
		if _, err := path.Match(glob, ""); err != nil {
			return nil, fmt.Errorf("known-failing line %d: bad glob %q: %w", n, glob, err)
		}
		k.entries = append(k.entries, knownEntry{glob, reason})
	}
	return k, sc.Err()
}

// LoadKnownFailing reads a known-failing file.
func LoadKnownFailing(file string) (*KnownFailing, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	k, err := ParseKnownFailing(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return k, nil
}

// Match returns the reason of the first entry whose glob matches name.
func (k *KnownFailing) Match(name string) (string, bool) {
	if k == nil {
		return "", false
	}
	for _, e := range k.entries {
		if ok, _ := path.Match(e.glob, name); ok {
			return e.reason, true
		}
	}
	return "", false
}
