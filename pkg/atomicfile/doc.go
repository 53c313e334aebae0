// Package atomicfile writes files all at once or not at all: Write and WriteBytes go through a
// temporary file in the target's folder, synced and renamed over the target, and the folder synced
// after the rename, so that a crash or a power loss leaves the previous file or the new one, never a
// partial one. SyncTree and SyncDir flush a written folder (checkpoints); RemoveStale clears a killed
// writer's leftovers. New files get mode 0644 (less the umask).
//
// The temporary file is named .<name>.<pid>-<random>.drmas-tmp. A process killed while writing
// (SIGKILL, power loss) leaves it behind; the next Write to the same path removes such leftovers whose
// process is gone, and nothing else.
package atomicfile
