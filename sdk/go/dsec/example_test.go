package dsec_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Run a command in a fresh sandbox and remove it afterwards.
func Example() {
	ctx := context.Background()
	cfg, err := dsec.LoadConfig(dsec.Config{}) // flags would go in here
	if err != nil {
		log.Fatal(err)
	}
	c, err := dsec.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sb, err := c.Create(ctx, dsec.CreateOptions{
		Image:   "python:3.12",
		Memory:  1 << 30,
		Labels:  map[string]string{"job": "demo"},
		IdleTTL: 10 * time.Minute,
	})
	var de *dsec.Error
	if errors.As(err, &de) && errors.Is(err, dsec.ErrResourceExhausted) {
		log.Fatalf("the platform is full; try again in %s", de.RetryAfter)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Delete(context.WithoutCancel(ctx))

	if err := sb.WriteFile(ctx, "/workspace/main.py", []byte("print(6*7)\n"), dsec.WithMakeParents()); err != nil {
		log.Fatal(err)
	}
	res, err := sb.Exec(ctx, []string{"python3", "main.py"}, dsec.WithCwd("/workspace"), dsec.WithTimeout(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("exit %d: %s", res.Code(), res.Stdout)
}

func ExampleParseSize() {
	for _, s := range []string{"512M", "2G", "1.5GiB", "12X"} {
		n, err := dsec.ParseSize(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(n, dsec.FormatSize(n))
	}
	// Output:
	// 536870912 512M
	// 2147483648 2G
	// 1610612736 1.5G
	// size "12X" has an unknown unit "X": want a number and an optional unit K, M, G or T, powers of 1024, such as "512M" or "1.5G"
}
