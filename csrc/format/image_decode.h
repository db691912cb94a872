// Image payload decoders of the record format (docs/FORMAT.md): PNG through
// libspng and JPEG through libjpeg-turbo's TurboJPEG API, each straight into
// the destination in the field's layout (hwc as the libraries write it; chw
// split into planes as rows arrive, PNG, or after a scratch decode, JPEG).
//
// Both distrust their input: the header's width, height, bit depth and
// channels must equal the field's geometry before a byte is written, and the
// library decodes into exactly the field's decoded bytes (no bombs). Any
// problem throws DecodeError with the reason; the caller adds field, file and
// record.
//
// Thread safety: one ImageDecoder per thread (it owns a TurboJPEG handle and
// scratch buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace fastload {

// The image shape a png or jpeg field decodes to.
struct ImageGeometry {
  uint32_t height = 0;
  uint32_t width = 0;
  uint32_t channels = 0;
  bool planar = false;  // chw (one plane per channel) rather than hwc (interleaved)
};

class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;
  ImageDecoder(ImageDecoder&&) noexcept;
  ImageDecoder& operator=(ImageDecoder&&) noexcept;

  // Decodes a PNG of `geometry` with samples of `itemsize` bytes (1 or 2,
  // host-endian) into dst (dst_size == height*width*channels*itemsize).
  void decode_png(const uint8_t* src, size_t src_size, const ImageGeometry& geometry, uint32_t itemsize,
                  uint8_t* dst, size_t dst_size);

  // Decodes a baseline or progressive JPEG of `geometry` (1 channel: grayscale,
  // 3: RGB) into dst (dst_size == height*width*channels).
  void decode_jpeg(const uint8_t* src, size_t src_size, const ImageGeometry& geometry, uint8_t* dst,
                   size_t dst_size);

 private:
  // decode_jpeg's work with a live handle; decode_jpeg replaces the handle when it throws.
  void decode_jpeg_with_handle(const uint8_t* src, size_t src_size, const ImageGeometry& geometry, uint8_t* dst,
                               size_t dst_size);
  struct TjDeleter {
    void operator()(void* handle) const noexcept;
  };
  std::unique_ptr<void, TjDeleter> tj_;
  std::vector<uint8_t> row_;
  std::vector<uint8_t> scratch_;
};

// The libraries' own decode calls with none of the checks or layout work
// above (interleaved output, fresh context per image as decode_png uses):
// the benchmarks' floors. Return false when the library reports an error.
bool plain_png_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t dst_size);
bool plain_jpeg_decode(void* tj_handle, const uint8_t* src, size_t src_size, uint8_t* dst, const ImageGeometry& g);
void* plain_jpeg_handle();
void plain_jpeg_free(void* tj_handle) noexcept;

}  // namespace fastload
