#include "format/image_decode.h"

#include <spng.h>
#include <turbojpeg.h>

#include <climits>
#include <cstring>
#include <string>

#include "errors.h"

namespace fastload {
namespace {

struct SpngDeleter {
  void operator()(spng_ctx* ctx) const noexcept { spng_ctx_free(ctx); }
};

// PNG color type of 1..4 interleaved channels: gray, gray+alpha, RGB, RGBA.
int png_color_type(uint32_t channels) {
  switch (channels) {
    case 1: return SPNG_COLOR_TYPE_GRAYSCALE;
    case 2: return SPNG_COLOR_TYPE_GRAYSCALE_ALPHA;
    case 3: return SPNG_COLOR_TYPE_TRUECOLOR;
    case 4: return SPNG_COLOR_TYPE_TRUECOLOR_ALPHA;
    default: return -1;
  }
}

void check_spng(int ret, const char* what) {
  if (ret != 0) throw DecodeError(std::string("png ") + what + ": " + spng_strerror(ret));
}

// Copies one interleaved row of `width` pixels of `channels` samples into
// row y of each of the `channels` planes of an image of `plane` bytes each.
void split_row(const uint8_t* row, uint8_t* dst, size_t y, size_t width, size_t channels, size_t itemsize,
               size_t plane) {
  const size_t pixel = channels * itemsize;
  for (size_t c = 0; c < channels; ++c) {
    uint8_t* out = dst + c * plane + y * width * itemsize;
    const uint8_t* in = row + c * itemsize;
    if (itemsize == 1) {
      for (size_t x = 0; x < width; ++x) out[x] = in[x * pixel];
    } else {
      for (size_t x = 0; x < width; ++x) std::memcpy(out + x * itemsize, in + x * pixel, itemsize);
    }
  }
}

}  // namespace

void ImageDecoder::TjDeleter::operator()(void* handle) const noexcept { tjDestroy(handle); }

ImageDecoder::ImageDecoder() = default;
ImageDecoder::~ImageDecoder() = default;
ImageDecoder::ImageDecoder(ImageDecoder&&) noexcept = default;
ImageDecoder& ImageDecoder::operator=(ImageDecoder&&) noexcept = default;

void ImageDecoder::decode_png(const uint8_t* src, size_t src_size, const ImageGeometry& g, uint32_t itemsize,
                              uint8_t* dst, size_t dst_size) {
  std::unique_ptr<spng_ctx, SpngDeleter> ctx(spng_ctx_new(0));
  if (!ctx) throw std::bad_alloc();
  // No image larger than the field, no chunk larger than the payload, no
  // ancillary chunk cache beyond the payload's size.
  check_spng(spng_set_image_limits(ctx.get(), g.width, g.height), "limits");
  check_spng(spng_set_chunk_limits(ctx.get(), src_size, src_size), "limits");
  check_spng(spng_set_png_buffer(ctx.get(), src, src_size), "buffer");
  spng_ihdr ihdr{};
  check_spng(spng_get_ihdr(ctx.get(), &ihdr), "header");
  if (ihdr.width != g.width || ihdr.height != g.height) {
    throw DecodeError("png of " + std::to_string(ihdr.width) + "x" + std::to_string(ihdr.height) +
                      " pixels, the field has " + std::to_string(g.width) + "x" + std::to_string(g.height));
  }
  if (ihdr.bit_depth != 8 * itemsize) {
    throw DecodeError("png of bit depth " + std::to_string(ihdr.bit_depth) + ", the field has " +
                      std::to_string(8 * itemsize));
  }
  if (static_cast<int>(ihdr.color_type) != png_color_type(g.channels)) {
    throw DecodeError("png color type " + std::to_string(ihdr.color_type) + " does not hold the field's " +
                      std::to_string(g.channels) + " channels");
  }
  if (ihdr.interlace_method != 0) throw DecodeError("interlaced png (fastload writes none)");
  size_t size = 0;
  check_spng(spng_decoded_image_size(ctx.get(), SPNG_FMT_PNG, &size), "size");
  if (size != dst_size) {
    throw DecodeError("png decodes to " + std::to_string(size) + " bytes, expected " + std::to_string(dst_size));
  }
  if (!g.planar || g.channels == 1) {
    check_spng(spng_decode_image(ctx.get(), dst, dst_size, SPNG_FMT_PNG, 0), "data");
    return;
  }
  check_spng(spng_decode_image(ctx.get(), nullptr, 0, SPNG_FMT_PNG, SPNG_DECODE_PROGRESSIVE), "data");
  const size_t row_bytes = dst_size / g.height;
  const size_t plane = dst_size / g.channels;
  if (row_.size() < row_bytes) row_.resize(row_bytes);
  for (size_t y = 0; y < g.height; ++y) {
    const int ret = spng_decode_row(ctx.get(), row_.data(), row_bytes);
    if (ret != 0 && !(ret == SPNG_EOI && y + 1 == g.height)) check_spng(ret, "row");
    split_row(row_.data(), dst, y, g.width, g.channels, itemsize, plane);
  }
}

void ImageDecoder::decode_jpeg(const uint8_t* src, size_t src_size, const ImageGeometry& g, uint8_t* dst,
                               size_t dst_size) {
  if (!tj_) {
    tj_.reset(tjInitDecompress());
    if (!tj_) throw std::bad_alloc();
  }
  if (src_size > ULONG_MAX) throw DecodeError("jpeg payload too large");
  try {
    decode_jpeg_with_handle(src, src_size, g, dst, dst_size);
  } catch (...) {
    // TurboJPEG 2.x leaves a handle whose header read failed mid-stream: the next,
    // intact stream would then fail too ("Unsupported marker type"). A fresh one.
    tj_.reset();
    throw;
  }
}

void ImageDecoder::decode_jpeg_with_handle(const uint8_t* src, size_t src_size, const ImageGeometry& g, uint8_t* dst,
                                           size_t dst_size) {
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj_.get(), src, static_cast<unsigned long>(src_size), &width, &height, &subsamp,
                          &colorspace) != 0) {
    throw DecodeError(std::string("jpeg header: ") + tjGetErrorStr2(tj_.get()));
  }
  if (static_cast<uint32_t>(width) != g.width || static_cast<uint32_t>(height) != g.height) {
    throw DecodeError("jpeg of " + std::to_string(width) + "x" + std::to_string(height) + " pixels, the field has " +
                      std::to_string(g.width) + "x" + std::to_string(g.height));
  }
  const bool gray = colorspace == TJCS_GRAY;
  if ((g.channels == 1) != gray || (g.channels == 3 && colorspace != TJCS_YCbCr)) {
    throw DecodeError("jpeg colorspace " + std::to_string(colorspace) + " does not hold the field's " +
                      std::to_string(g.channels) + " channels");
  }
  const size_t expected = static_cast<size_t>(g.width) * g.height * g.channels;
  if (expected != dst_size) throw DecodeError("jpeg geometry disagrees with the field's size");
  const int format = gray ? TJPF_GRAY : TJPF_RGB;
  const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  uint8_t* out = dst;
  if (g.planar && g.channels > 1) {
    if (scratch_.size() < dst_size) scratch_.resize(dst_size);
    out = scratch_.data();
  }
  if (tjDecompress2(tj_.get(), src, static_cast<unsigned long>(src_size), out, width, 0, height, format, flags) != 0) {
    throw DecodeError(std::string("jpeg data: ") + tjGetErrorStr2(tj_.get()));
  }
  if (out != dst) {
    const size_t pixels = static_cast<size_t>(g.width) * g.height;
    uint8_t* r = dst;
    uint8_t* gr = dst + pixels;
    uint8_t* b = dst + 2 * pixels;
    for (size_t i = 0; i < pixels; ++i) {
      r[i] = out[3 * i];
      gr[i] = out[3 * i + 1];
      b[i] = out[3 * i + 2];
    }
  }
}

bool plain_png_decode(const uint8_t* src, size_t src_size, uint8_t* dst, size_t dst_size) {
  std::unique_ptr<spng_ctx, SpngDeleter> ctx(spng_ctx_new(0));
  return ctx && spng_set_png_buffer(ctx.get(), src, src_size) == 0 &&
         spng_decode_image(ctx.get(), dst, dst_size, SPNG_FMT_PNG, 0) == 0;
}

void* plain_jpeg_handle() { return tjInitDecompress(); }

void plain_jpeg_free(void* tj_handle) noexcept { tjDestroy(tj_handle); }

bool plain_jpeg_decode(void* tj_handle, const uint8_t* src, size_t src_size, uint8_t* dst, const ImageGeometry& g) {
  return tjDecompress2(tj_handle, src, static_cast<unsigned long>(src_size), dst, static_cast<int>(g.width), 0,
                       static_cast<int>(g.height), g.channels == 1 ? TJPF_GRAY : TJPF_RGB, 0) == 0;
}

}  // namespace fastload
