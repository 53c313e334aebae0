package tbevent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// maxRecord bounds a record's length when reading: drmas's records are kilobytes.
const maxRecord = 64 << 20

// ErrTorn is returned by ReadRecords for a file that ends inside a record (a crash mid-write).
var ErrTorn = errors.New("event file ends inside a record")

// ReadRecords reads TFRecords from r, checking both CRCs, and calls fn with each record's data (valid
// until fn returns) and the offset where the record ends. A file cut short in its last record gives
// ErrTorn after the records before it.
func ReadRecords(r io.Reader, fn func(data []byte, end int64) error) error {
	var head [12]byte
	var off int64
	var data []byte
	for n := 0; ; n++ {
		if k, err := io.ReadFull(r, head[:]); err != nil {
			if k == 0 && err == io.EOF {
				return nil
			}
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return ErrTorn
			}
			return err
		}
		if got, want := binary.LittleEndian.Uint32(head[8:]), MaskedCRC(head[:8]); got != want {
			return fmt.Errorf("record %d: length CRC %#x, want %#x", n, got, want)
		}
		size := binary.LittleEndian.Uint64(head[:8])
		if size > maxRecord {
			return fmt.Errorf("record %d: length %d over %d", n, size, maxRecord)
		}
		if cap(data) < int(size)+4 {
			data = make([]byte, size+4)
		}
		data = data[:size+4]
		if _, err := io.ReadFull(r, data); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
				return ErrTorn
			}
			return err
		}
		if got, want := binary.LittleEndian.Uint32(data[size:]), MaskedCRC(data[:size]); got != want {
			return fmt.Errorf("record %d: data CRC %#x, want %#x", n, got, want)
		}
		off += 12 + int64(size) + 4
		if err := fn(data[:size], off); err != nil {
			return err
		}
	}
}

// ParseEvent decodes an Event protocol buffer; fields this package does not write are skipped.
func ParseEvent(b []byte) (Event, error) {
	var e Event
	err := fields(b, func(n protowire.Number, t protowire.Type, v []byte, x uint64) error {
		switch {
		case n == eventWallTime && t == protowire.Fixed64Type:
			e.WallTime = math.Float64frombits(x)
		case n == eventStep && t == protowire.VarintType:
			e.Step = int64(x)
		case n == eventFileVersion && t == protowire.BytesType:
			e.FileVersion = string(v)
		case n == eventSourceMetadata && t == protowire.BytesType:
			return fields(v, func(n protowire.Number, t protowire.Type, v []byte, _ uint64) error {
				if n == sourceMetadataWriter && t == protowire.BytesType {
					e.Writer = string(v)
				}
				return nil
			})
		case n == eventSummary && t == protowire.BytesType:
			return fields(v, func(n protowire.Number, t protowire.Type, v []byte, _ uint64) error {
				if n != summaryValue || t != protowire.BytesType {
					return nil
				}
				val, err := parseValue(v)
				e.Summary = append(e.Summary, val)
				return err
			})
		}
		return nil
	})
	return e, err
}

func parseValue(b []byte) (Value, error) {
	var v Value
	err := fields(b, func(n protowire.Number, t protowire.Type, b []byte, x uint64) error {
		switch {
		case n == valueTag && t == protowire.BytesType:
			v.Tag = string(b)
		case n == valueSimple && t == protowire.Fixed32Type:
			v.Kind, v.Scalar = KindScalar, math.Float32frombits(uint32(x))
		case n == valueMetadata && t == protowire.BytesType:
			return fields(b, func(n protowire.Number, t protowire.Type, b []byte, _ uint64) error {
				if n != metadataPluginData || t != protowire.BytesType {
					return nil
				}
				return fields(b, func(n protowire.Number, t protowire.Type, b []byte, _ uint64) error {
					if n == pluginName && t == protowire.BytesType {
						v.Plugin = string(b)
					}
					return nil
				})
			})
		case n == valueTensor && t == protowire.BytesType:
			var isString bool
			var strs []string
			err := fields(b, func(n protowire.Number, t protowire.Type, b []byte, x uint64) error {
				switch {
				case n == tensorDType && t == protowire.VarintType:
					isString = x == dtString
				case n == tensorStringVal && t == protowire.BytesType:
					strs = append(strs, string(b))
				}
				return nil
			})
			if isString && len(strs) > 0 {
				v.Kind, v.Text = KindText, strs[0]
			}
			return err
		case n == valueHisto && t == protowire.BytesType:
			h, err := parseHisto(b)
			v.Kind, v.Histo = KindHistogram, &h
			return err
		}
		return nil
	})
	return v, err
}

func parseHisto(b []byte) (Histogram, error) {
	var h Histogram
	err := fields(b, func(n protowire.Number, t protowire.Type, b []byte, x uint64) error {
		f := math.Float64frombits(x)
		switch {
		case n == histoMin && t == protowire.Fixed64Type:
			h.Min = f
		case n == histoMax && t == protowire.Fixed64Type:
			h.Max = f
		case n == histoNum && t == protowire.Fixed64Type:
			h.Num = f
		case n == histoSum && t == protowire.Fixed64Type:
			h.Sum = f
		case n == histoSumSquares && t == protowire.Fixed64Type:
			h.SumSquares = f
		case (n == histoBucketLimit || n == histoBucket) && t == protowire.BytesType:
			if len(b)%8 != 0 {
				return fmt.Errorf("histogram field %d: %d bytes of packed doubles", n, len(b))
			}
			var vs []float64
			for i := 0; i < len(b); i += 8 {
				vs = append(vs, math.Float64frombits(binary.LittleEndian.Uint64(b[i:])))
			}
			if n == histoBucketLimit {
				h.BucketLimit = append(h.BucketLimit, vs...)
			} else {
				h.Bucket = append(h.Bucket, vs...)
			}
		}
		return nil
	})
	return h, err
}

// fields walks the fields of a protocol buffer message: fn gets each field's number and wire type,
// with its bytes (BytesType) or its number (varint, fixed32, fixed64).
func fields(b []byte, fn func(n protowire.Number, t protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		n, t, k := protowire.ConsumeTag(b)
		if k < 0 {
			return fmt.Errorf("protobuf: %w", protowire.ParseError(k))
		}
		b = b[k:]
		var v []byte
		var x uint64
		switch t {
		case protowire.VarintType:
			x, k = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var y uint32
			y, k = protowire.ConsumeFixed32(b)
			x = uint64(y)
		case protowire.Fixed64Type:
			x, k = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, k = protowire.ConsumeBytes(b)
		default:
			k = protowire.ConsumeFieldValue(n, t, b)
		}
		if k < 0 {
			return fmt.Errorf("protobuf field %d: %w", n, protowire.ParseError(k))
		}
		b = b[k:]
		if err := fn(n, t, v, x); err != nil {
			return err
		}
	}
	return nil
}
