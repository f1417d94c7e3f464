package aaa

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DecodeJSON decodes one JSON value from data into v. Unlike json.Unmarshal,
// numbers decoded into interface values become json.Number rather than
// float64, so integers of any size keep every digit (250 stays 250, and
// 2^53+1 is not rounded). Decode into int64, uint64, json.Number or
// *big.Int fields for exact integers. Trailing data after the value is an
// error.
func DecodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("aaa: decode JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("aaa: decode JSON: trailing data after the value")
	}
	return nil
}

// EncodeJSON encodes v as compact JSON text, without escaping <, > and &.
// json.Number and json.RawMessage values are written exactly as they are, so
// numbers decoded with DecodeJSON round-trip unchanged.
func EncodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("aaa: encode JSON: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// encodeObject encodes v as JSON text for a field that takes a JSON object;
// nil becomes the empty string, which the server reads as {}.
func encodeObject(v any) (string, error) {
	if v == nil {
		return "", nil
	}
	if raw, ok := v.(json.RawMessage); ok && len(raw) == 0 {
		return "", nil
	}
	b, err := EncodeJSON(v)
	return string(b), err
}
