// Package ckstoretest is the contract suite that every ckstore.Store implementation
// passes: Run takes a function returning a fresh, empty store location (a local folder,
// or s3://bucket/prefix with the AWS environment variables set) and opens stores there
// with ckstore.Open, several at once where a case needs a second reader.
//
// The killed-save case re-runs the test binary as a helper process that saves a
// checkpoint and is killed with SIGKILL after its first file is uploaded; the package
// whose tests call Run must let the helper run first:
//
//	func TestMain(m *testing.M) { ckstoretest.HelperMain(); os.Exit(m.Run()) }
package ckstoretest
