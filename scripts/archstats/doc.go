// Command archstats prints shape figures for one package folder: a struct's field and method counts
// (and the files its methods sit in), the longest functions, and the file-level references between
// the package's files. Syntax only (go/ast), so it runs without libtorch:
//
//	go run ./scripts/archstats -dir pkg/train -type Trainer
//
// These are the shape figures issue #28 asks for. A "back-reference" pair is two files that use each
// other (file A uses a top-level name declared in file B and B one declared in A). A selector x.Name
// counts as a use of method Name wherever Name is declared as a method in exactly one file of the
// package; test files are left out.
package main
