// Package jsonl reads JSON lines files (one JSON value per line) line by line, with the line numbers
// that error messages name (Read, ReadFile, Line). Decoding a line is the caller's: each file kind has
// its own record shape. Num and AppendNum write non-finite numbers as null.
package jsonl
