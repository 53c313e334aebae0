// Package policytest holds helpers for the tests of packages that use policies, as net/http/httptest
// does for HTTP: Load loads a policy folder and Adapter makes a LoRA adapter on a base, both failing
// the test on error.
package policytest
