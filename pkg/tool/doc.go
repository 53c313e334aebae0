// Package tool gives agents function tools: tools with a name, a description and a JSON schema of
// their arguments, rendered into a chat template's `tools` list and called by name with a JSON
// arguments object. Tools are built in (a Go Func; Builtins are drmas's own, builtin.go: lookup, a
// fact of the call's task, and search, over the run's retriever) or come from MCP
// servers (the Model Context Protocol, through its official Go SDK): stdio servers that drmas starts
// and streamable-HTTP servers it connects to.
//
// A Box holds the tools and runs calls:
//
//	box, err := tool.Open(ctx, cfg, &tool.Builtins{Retriever: retr, TopK: 3}) // cfg: the settings and mcp_servers of a run config
//	defer box.Close()                       // stops the stdio servers
//	agentBox, err := box.For("search", "echo")
//	defs := agentBox.Definitions()          // the chat template's tools=[...]
//	res, err := agentBox.Call(ctx, tool.Call{Name: "search", Arguments: json.RawMessage(`{"query": "x"}`), Task: task})
//	// res.Content() goes back to the model as the tool message; res.Failure classifies a failed call
//
// Call checks the arguments against the tool's schema (github.com/google/jsonschema-go, draft 2020-12
// and draft-07), runs at most Settings.Concurrency calls at once, bounds each by its timeout and cuts
// its text to Settings.MaxResultChars with a marker. A call's failures that the model caused or the
// tool reported come back in the Result (UnknownTool, BadArguments, ToolError, Timeout) with a reason
// naming the tool; Call's error is for what no model caused (ctx ended, a server that cannot be
// reached after Settings.Retries tries or restarted), naming the tool and its server.
//
// A transport failure of an MCP server (a stdio server that exited, an HTTP session lost) starts it
// again in the background (a new process, a new session; at most 3 tries per failure) and the call
// is tried again; a server that cannot be restarted fails every later call with an error naming it
// and the end of its stderr. Tools are listed once, at Open, and checked against the names the
// config gives (Server.Tools): a missing one is an error naming the server and the tool.
//
// A Box is a flow's env.Toolbox (env.go: Specs, and Run, whose failed calls are the agent's
// *env.ToolError); the task of each call is an explicit argument (Call.Task), which the built-in
// tools read.
package tool
