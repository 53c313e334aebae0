package jsonl

import (
	"math"
	"strconv"
)

// Num is a float64 as every drmas file writes a figure that can be undefined (metrics.jsonl rows,
// advantage statistics, run summaries): a finite value as its shortest decimal form
// (strconv 'g', -1), a NaN or ±Inf as null, which encoding/json refuses to write. Readers take null
// back as NaN.
type Num float64

// MarshalJSON writes the number, or null.
func (n Num) MarshalJSON() ([]byte, error) { return AppendNum(nil, float64(n)), nil }

// AppendNum appends v as Num writes it.
func AppendNum(b []byte, v float64) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}
