package main

import _ "go.etcd.io/etcd/server/v3/embed"

func main() {}
