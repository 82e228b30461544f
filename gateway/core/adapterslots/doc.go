// Package adapterslots keeps a training backend's adapters within its slots.
//
// A backend holds at most max_adapters adapters (its capabilities). When more runs are live
// than that, the least recently used idle run's adapter is offloaded (its complete training
// state — weights, Adam moments and step, and any accumulated gradient — saved into a spill
// folder, then deleted from the backend) and restored from that folder before its next
// task, so the run continues bit-identically. A run is pinned while one of its tasks is
// taken (from Admit until Unpin), and a pinned run is never offloaded. A backend that cannot
// save gradients (Config.Gradients false) only has runs without pending gradients
// (SetGradients) offloaded. When every slot is pinned, the run waits (Park) and is woken
// (its Wake) when a slot is unpinned.
//
// Moving an adapter (restoring it, or offloading another to make room) calls the backend and
// the file system, so a Table never does it in Admit: Admit only decides (pinned now,
// lane.ErrMoveNeeded, or lane.ErrNoSlot), and Move, which the scheduler runs on a goroutine
// of its own while the run is held busy, does the work and reserves the pin for the run's
// next Admit. An adapter being offloaded still holds its slot (the backend still has it)
// until DeleteAdapter returns.
//
// A Table is generic over the run type R (the core uses *trainrun.Run[*operation]): it needs
// only a run's id (its adapter id on the backend) and a way to wake it. *Table[R]
// implements lane.Slots.
//
// # Lock order
//
// Table.mu (RankTable) is in the core's lock order (gateway/core/doc.go): nothing is taken
// under it, and no I/O runs under it. Runs waiting for a slot are woken after it is released.
package adapterslots
