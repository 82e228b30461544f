// Package filewatch keeps what an operator's file says in force while a server runs (the
// price sheet, loops serve --prices; the workspace policy, --workspace-policy): the file is
// parsed at start, where an error refuses the start, then looked at every PollInterval and
// parsed again when its modification time or size changed. A changed file that does not
// parse is logged and the value in force kept, and it is not read again until it changes.
// Each value parsed is new: one in force is never changed, so a reader may keep it.
package filewatch
