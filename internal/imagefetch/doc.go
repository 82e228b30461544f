// Package imagefetch fetches the images that Tinker's image_asset_pointer chunks name by
// URL, from the hosts the operator allows and no others: HTTPS only, no redirects, at most
// vision.MaxBytes an image, a deadline per request, and a bound on the fetches in flight
// across the gateway. Without allowed hosts nothing is fetched.
package imagefetch
