// Package console is the web console's real-browser test (make test-console): it starts
// `loops serve` with two keys in two workspaces, drives Debian's chromium headless with
// chromedp through sign-in, a run appearing and its charts gaining points while a tinker
// SDK script (train.py) trains, a checkpoint opened, published and deleted, the usage,
// sessions and limits pages, and the second key seeing none of the first key's runs. It
// saves a screenshot of every step into a folder it prints. The test file carries the
// build tag "console", so `go test ./...` does not build or run it.
package console
