// Command approval is aaa's reference scenario: a tool marked
// RequiresApproval runs only after a human grants that exact call.
//
// Start a server (`cargo run --release -- serve` in the repository), then
// `go run ./examples/approval` in clients/go (the address comes from env
// AAA_SERVER, default 127.0.0.1:50051). It prints:
//
//	waiting for approval of: wire_money {"amount":250,"to":"ACME"}
//	sent $250 to ACME
//
// The worker (serving the tool wire_money and the model "seed") and the
// client run in this one process; they could as well be separate programs.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"

	aaa "aaa.dev/clients/go"
)

// transfer is wire_money's arguments; int64 keeps the amount exact.
type transfer struct {
	Amount int64  `json:"amount"`
	To     string `json:"to"`
}

// wireMoney is the tool that must not run without a human's grant.
var wireMoney = aaa.Tool{
	Name:             "wire_money",
	Description:      "Send money",
	Parameters:       json.RawMessage(`{"type":"object","properties":{"amount":{"type":"integer"},"to":{"type":"string"}},"required":["amount","to"]}`),
	RequiresApproval: true,
	Handler: aaa.Typed(func(ctx context.Context, t transfer) (string, error) {
		return fmt.Sprintf("sent $%d to %s", t.Amount, t.To), nil
	}),
}

// seed is a fake LLM: asked by the user, it calls wire_money; otherwise it
// repeats the last message (the tool's output).
func seed(ctx context.Context, req *aaa.ModelRequest) (aaa.Reply, error) {
	last := req.Messages[len(req.Messages)-1]
	if last.Role == aaa.RoleUser {
		call := aaa.ToolCallRequest{Name: "wire_money", Arguments: transfer{Amount: 250, To: "ACME"}}
		return aaa.Reply{ToolCalls: []aaa.ToolCallRequest{call}}, nil
	}
	return aaa.Reply{Content: last.Content}, nil
}

func main() {
	if err := run(context.Background(), os.Getenv("AAA_SERVER"), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run plays the scenario against the server at addr, printing to out.
func run(ctx context.Context, addr string, out io.Writer) error {
	client, err := aaa.Dial(addr)
	if err != nil {
		return err
	}
	defer client.Close()

	worker := aaa.NewWorker(client, aaa.WorkerOptions{
		Identity: "payments-1",
		Tools:    []aaa.Tool{wireMoney},
		Models:   map[string]aaa.ModelFunc{"seed": seed},
	})
	if _, err := worker.Register(ctx); err != nil { // before a run names its tools
		return err
	}
	workerCtx, stopWorker := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(workerCtx) }()
	defer func() { stopWorker(); <-stopped }()

	started, err := client.StartRun(ctx, aaa.StartRunRequest{
		Task:  "Pay ACME $250",
		Model: aaa.WorkerModel("seed"),
		Tools: []aaa.ToolRef{{Name: "wire_money"}},
	})
	if err != nil {
		return err
	}

	// The run waits for a human; nothing runs until then.
	var request struct {
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	opts := aaa.EventsOptions{Follow: true, StopAtEnd: true, TypePrefix: aaa.EventApprovalRequested}
	for event, err := range client.Events(ctx, started.RunID, opts) {
		if err != nil {
			return err
		}
		if err := event.Decode(&request); err != nil {
			return err
		}
		break
	}
	fmt.Fprintln(out, "waiting for approval of:", request.Name, string(request.Arguments))

	// A human grants that exact call (from any process, at any time).
	if _, err := client.Approve(ctx, started.RunID, request.CallID); err != nil {
		return err
	}
	outcome, err := client.Result(ctx, started.RunID)
	if err != nil {
		return err
	}
	if outcome.Status != aaa.StatusCompleted {
		return fmt.Errorf("run %s ended %s: %v", started.RunID, outcome.Status, outcome.Error)
	}
	fmt.Fprintln(out, outcome.Text)
	return nil
}
