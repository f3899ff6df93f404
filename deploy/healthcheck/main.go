// Command healthcheck is the health probe of Switchyard's FROM-scratch
// container images, which hold no shell, curl or wget: it GETs each URL given
// and exits 0 when every one answers 2xx within the timeout, 1 otherwise.
//
//	healthcheck http://127.0.0.1:8222/healthz
//
// It is built next to the switchyard binary by deploy/build-images.sh.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: healthcheck URL...")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for _, url := range os.Args[1:] {
		if err := check(ctx, url); err != nil {
			fmt.Fprintf(os.Stderr, "healthcheck: %s: %v\n", url, err)
			os.Exit(1)
		}
	}
}

func check(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	return nil
}
