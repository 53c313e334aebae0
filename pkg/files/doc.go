// Package files opens the files a user points drmas at (configs, model folders, datasets): Open and
// Read accept only regular files (a FIFO would block for ever, /dev/zero never ends, a directory is a
// mistake) and check a size bound before reading, so that a wrong path gives a clear error instead
// of a hang or an out-of-memory kill.
package files
