package aaa_test

import (
	"context"
	"encoding/json"
	"math"
	"math/big"
	"strings"
	"testing"

	aaa "aaa.dev/clients/go"
)

// bigArgs holds numbers no float64 can carry.
const bigArgs = `{"big":123456789012345678901234567890,"max_u64":18446744073709551615,"min_i64":-9223372036854775808,"p53":9007199254740993}`

func TestDecodeEncodeJSONKeepNumbers(t *testing.T) {
	var v map[string]any
	if err := aaa.DecodeJSON([]byte(bigArgs), &v); err != nil {
		t.Fatal(err)
	}
	if v["p53"] != json.Number("9007199254740993") {
		t.Fatalf("p53 decoded as %#v", v["p53"])
	}
	out, err := aaa.EncodeJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != bigArgs {
		t.Fatalf("round trip:\n%s\nwant:\n%s", out, bigArgs)
	}
	if err := aaa.DecodeJSON([]byte(`{} {}`), &v); err == nil {
		t.Fatal("trailing data accepted")
	}
	if out, _ := aaa.EncodeJSON("a<b & c"); string(out) != `"a<b & c"` {
		t.Fatalf("escaped: %s", out)
	}
}

func TestExactNumbersEndToEnd(t *testing.T) {
	e := setup(t)
	type args struct {
		Big    *big.Int    `json:"big"`
		MaxU64 uint64      `json:"max_u64"`
		MinI64 int64       `json:"min_i64"`
		P53    json.Number `json:"p53"`
	}
	got := make(chan args, 2)
	numbers := aaa.Tool{
		Name:             "numbers",
		RequiresApproval: true,
		Handler: aaa.Typed(func(ctx context.Context, a args) (args, error) {
			got <- a
			return a, nil // the output carries the same numbers back
		}),
	}
	huge, _ := new(big.Int).SetString("123456789012345678901234567890", 10)
	want := args{Big: huge, MaxU64: math.MaxUint64, MinI64: math.MinInt64, P53: "9007199254740993"}
	model := func(ctx context.Context, req *aaa.ModelRequest) (aaa.Reply, error) {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == aaa.RoleUser {
			return aaa.Reply{ToolCalls: []aaa.ToolCallRequest{{Name: "numbers", Arguments: want}}}, nil
		}
		return aaa.Reply{Content: last.Content}, nil
	}
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{numbers}, Models: map[string]aaa.ModelFunc{"m": model}})

	// Arguments from a worker model, and from the scripted model.
	fromModel := e.start(t, aaa.StartRunRequest{Task: "go", Model: aaa.WorkerModel("m"), Tools: []aaa.ToolRef{{Name: "numbers"}}})
	scripted := e.start(t, aaa.StartRunRequest{
		Task:  "go",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "numbers", Arguments: json.RawMessage(bigArgs)}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "numbers"}},
	})
	for _, runID := range []string{fromModel, scripted} {
		e.waitFor(t, runID, aaa.EventApprovalRequested)
		var pending []aaa.Approval
		for a, err := range e.client.ListApprovals(e.ctx, aaa.ApprovalFilter{RunID: runID, Tool: "numbers"}) {
			if err != nil {
				t.Fatal(err)
			}
			pending = append(pending, a)
		}
		// The reviewer sees exactly the model's numbers.
		if len(pending) != 1 || string(pending[0].Arguments) != bigArgs {
			t.Fatalf("approval arguments: %+v", pending)
		}
		if _, err := e.client.Approve(e.ctx, runID, pending[0].CallID, aaa.WithArgumentsSHA256(pending[0].ArgumentsSHA256)); err != nil {
			t.Fatal(err)
		}
		// The tool gets them.
		a := <-got
		if a.Big.Cmp(want.Big) != 0 || a.MaxU64 != want.MaxU64 || a.MinI64 != want.MinI64 || a.P53 != want.P53 {
			t.Fatalf("tool got %+v", a)
		}
		// Its output comes back exact in the event and the run's result.
		out := e.result(t, runID)
		if out.Text != bigArgs {
			t.Fatalf("result text: %s", out.Text)
		}
		completed := ofType(e.events(t, runID), aaa.EventToolCompleted)
		if len(completed) != 1 || !strings.Contains(string(completed[0].Data), `"output":`+bigArgs) {
			t.Fatalf("tool.completed: %s", completed[0].Data)
		}
		var data struct {
			Output struct {
				P53 json.Number `json:"p53"`
			} `json:"output"`
		}
		if err := completed[0].Decode(&data); err != nil || data.Output.P53 != "9007199254740993" {
			t.Fatalf("decoded output: %+v %v", data, err)
		}
	}
}
