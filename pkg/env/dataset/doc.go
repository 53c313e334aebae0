// Package dataset loads question/answer datasets from JSON lines or Parquet files into env.Tasks
// (Load, with Options and Fields naming the columns).
//
// It knows the common shapes (GSM8K, MATH, Search-R1 QA) and the verl / Dr. MAS Parquet layout, where
// the gold answer lives in a nested column (`reward_model.ground_truth`); field names are
// configurable and may be dotted paths into nested objects, structs and lists.
package dataset
