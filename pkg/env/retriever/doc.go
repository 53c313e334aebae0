// Package retriever implements env.Retriever, the search tool of the search orchestra: an embedded
// BM25 index over a JSON lines corpus (on disk or in memory, built with bleve: OpenEmbedded,
// OpenMemory), and a client of the Search-R1 retrieval server HTTP API (NewHTTP). New picks one from
// the config.
package retriever
