// Package tbevent writes and reads TensorBoard event files: TFRecord framing around TensorFlow's
// Event protocol buffer, encoded field by field with protowire (no generated TensorFlow code).
//
// A TFRecord is
//
//	uint64 length (little-endian) | uint32 masked CRC-32C of the length | data | uint32 masked CRC-32C of data
//
// with the masked CRC ((crc >> 15) | (crc << 17)) + 0xa282ead8 over the Castagnoli polynomial. A file's
// first record is an Event whose file_version is "brain.Event:2"; drmas adds source_metadata.writer
// "drmas" to it, which is how Prune tells its own files from others. Every other Event carries a step,
// a wall time and a Summary of values: scalars (simple_value), text (a DT_STRING tensor with the
// "text" plugin's metadata) and histograms (HistogramProto).
package tbevent
