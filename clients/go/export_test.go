package redisrl

// ExampleAddr exposes the harness's server to the Example functions of package
// redisrl_test.
var ExampleAddr = exampleAddr
